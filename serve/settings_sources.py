"""Where ``ServeSettings`` values come from besides its arguments: the environment, keyed by
field name (:class:`FieldNames`, its undecodable values one line naming the variable), and the
repository file (:class:`RepositorySource`). Kept apart from serve.config, whose models they
feed, so that each stays short."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Tuple, Type

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError

from irpe.errors import InvalidInput

from .repository import read_repository

__all__ = ["FieldNames", "JSON_SHAPES", "RepositorySource", "env_variable"]


class FieldNames(PydanticBaseSettingsSource):
    """The environment source with its values keyed by field name, as the repository file's
    are: a field read from ``IRPE_SERVE_X`` or an older variable then replaces the file's
    value instead of sitting beside it (an extra key to pydantic)."""

    def __init__(self, settings_cls: Type[BaseSettings],
                 source: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> Tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> Dict[str, Any]:
        try:
            data = self.source()
        except SettingsError as exc:  # a JSON field whose variable is not JSON
            raise InvalidInput(self.undecodable(exc)) from None
        for name, field in self.settings_cls.model_fields.items():
            choices = getattr(field.validation_alias, "choices", None)
            if choices and choices[0] in data:  # the source names any match by the first
                data[name] = data.pop(choices[0])
        return data


    def undecodable(self, exc: SettingsError) -> str:
        """One line for a variable the environment source could not decode: its name, its
        value (shortened) and what it should be."""
        found = re.search(r'field "(\w+)"', str(exc))
        name = found.group(1) if found else ""
        variable = env_variable(name) if name else "an IRPE_SERVE_* variable"
        value = str(getattr(self.source, "env_vars", {}).get(variable.lower(), ""))
        shown = value if len(value) <= 60 else value[:57] + "..."
        why = exc.__cause__ or exc
        return f"invalid settings: {variable}={shown!r} is not JSON ({why}); it takes " \
               f"{JSON_SHAPES.get(name, 'a JSON value')}"


JSON_SHAPES = {"models": 'a JSON list of models: [{"name": ..., "path": ...}]',
               "ray": 'a JSON object: {"num_replicas": 2, ...}'}


def env_variable(field_name: str) -> str:
    """The ``IRPE_SERVE_*`` variable of a ServeSettings field."""
    return f"IRPE_SERVE_{field_name.upper()}"


class RepositorySource(PydanticBaseSettingsSource):
    """Lowest-priority source: the repository file named by a higher-priority source."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> Tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> Dict[str, Any]:
        path = self.current_state.get("repository")
        return read_repository(Path(path)) if path else {}
