"""The ``IRPE_SERVE_*`` variables as data: which variable set a setting (for one-line errors
that name it), and the settings they give, so a Ray replica or a ``serve run`` of an
``irpe serve --ray-config`` file on another machine serves what this process resolved
(serve.launch.Launch.with_environment; issue 50)."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from pydantic_settings import EnvSettingsSource

from .config import ServeSettings
from .settings_sources import FieldNames, env_variable

__all__ = ["env_variable_set", "environment_values"]

PATH_KEYS = ("path", "metadata", "labels", "ort_ops_library", "ov_ops_library", "repository",
             "cache_dir")


def environment_values() -> Dict[str, Any]:
    """The settings the ``IRPE_SERVE_*`` (and older) variables of this process give, keyed by
    field name, relative paths made absolute (to this folder), the bearer token left out (a
    secret is not written into a config file): what a replica on another machine, or a
    ``serve run`` where the variables are unset, must be given to serve the same."""
    data = FieldNames(ServeSettings, EnvSettingsSource(ServeSettings))()
    data.pop("auth_token", None)
    return _absolute(data)


def _absolute(data: Dict[str, Any]) -> Dict[str, Any]:
    """``data`` with its path values (and its models') absolute."""
    out = dict(data)
    for key in PATH_KEYS:
        if isinstance(out.get(key), str) and (key != "labels" or "\n" not in out[key]):
            out[key] = os.path.abspath(out[key])
    if isinstance(out.get("plugins"), list):
        out["plugins"] = [os.path.abspath(p) if isinstance(p, str) else p
                          for p in out["plugins"]]
    if isinstance(out.get("models"), list):
        out["models"] = [_absolute(m) if isinstance(m, dict) else m for m in out["models"]]
    return out


def env_variable_set(field_name: str) -> Optional[str]:
    """The variable of the environment that gives this ServeSettings field its value (its
    ``IRPE_SERVE_*`` name, else an older one), or None where none is set."""
    field = ServeSettings.model_fields.get(field_name)
    if field is None:
        return None
    choices = getattr(field.validation_alias, "choices", None) or [env_variable(field_name)]
    given = EnvSettingsSource(ServeSettings).env_vars  # names lower-cased (case-insensitive)
    return next((str(c) for c in choices if str(c).lower() in given), None)
