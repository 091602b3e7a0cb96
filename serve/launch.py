"""What ``irpe serve`` was asked to serve, as data: the one place its settings are resolved.

``irpe serve`` resolves a :class:`Launch` in its own process; a Ray Serve replica
(:mod:`serve.ray_app`) receives the same Launch and resolves it on its node, so a replica
serves exactly what ``irpe serve`` would have (the repository file, ``IRPE_SERVE_*``, the demo
models exported into that node's cache when missing).
"""
from __future__ import annotations

from typing import Any, Dict, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from irpe.errors import CLIError

from .config import ModelConfig, ServeSettings
from .errors import validation_message
from .settings_env import env_variable_set, environment_values

__all__ = ["Launch"]


class Launch(BaseModel):
    """The arguments of one ``irpe serve``: repository, setting overrides, demo models."""

    model_config = ConfigDict(extra="forbid")
    repository: Optional[str] = Field(None, description="model repository file (.yaml/.toml)")
    overrides: Dict[str, Any] = Field(default_factory=dict, description="ServeSettings "
                                      "fields given on the command line (highest priority)")
    environment: Dict[str, Any] = Field(
        default_factory=dict, description="settings from the IRPE_SERVE_* variables where irpe "
        "serve ran (with_environment): a replica elsewhere, or serve run / serve deploy of "
        "the --ray-config file, serves them whatever its own environment says; below "
        "overrides")
    demo: bool = Field(False, description="also serve the demo models (they are served "
                       "anyway when nothing else is configured)")
    backend: Literal["auto", "onnxruntime", "torch", "openvino"] = Field(
        "auto", description="backend of the demo models (auto: irpe.runtime.pick.onnx_runtime)")
    device: str = "cpu"
    precision: Optional[Literal["fp32", "fp16", "bf16"]] = Field(
        None, description="every torch- and openvino-backend model at this precision")

    def with_environment(self) -> "Launch":
        """This Launch carrying this process's IRPE_SERVE_* settings (config.environment_values),
        so the models resolved here are the ones served wherever it is resolved again."""
        return self.model_copy(update={"environment": environment_values()})

    def base_settings(self, default_threads: int = 0) -> ServeSettings:
        """The settings from the overrides, IRPE_SERVE_* and the repository file; ``threads``
        is ``default_threads`` where none of them sets it (a Ray replica: its CPUs)."""
        given = {**self.environment,
                 **{k: v for k, v in self.overrides.items() if v is not None}}
        if self.repository is not None:
            given["repository"] = self.repository
        settings = _validated(ServeSettings, **given)
        if settings.threads == 0 and default_threads > 0:
            settings = _validated(ServeSettings, **given, threads=default_threads)
        return settings

    def complete(self, settings: ServeSettings) -> ServeSettings:
        """``settings`` with the demo models added where asked for (or where nothing is
        configured, exporting them to ONNX on first use) and the precision applied."""
        if settings.repository and not settings.models and not self.demo:
            raise CLIError(f"no models in {settings.repository} (add models: [...], or pass "
                           "--demo to serve the demo models)")
        if self.demo or not settings.models:
            from .demo import demo_models
            try:
                demo = demo_models(self.backend, settings.cache_dir, self.device)
            except RuntimeError as exc:  # no ONNX exporter in this build
                raise CLIError(str(exc)) from None
            settings = settings.with_models(settings.models + demo)
        if self.precision:
            models = [_validated(ModelConfig, **{**m.model_dump(), "precision": self.precision})
                      if m.backend in ("torch", "openvino") else m for m in settings.models]
            settings = settings.model_copy(update={"models": models})
        return settings

    def settings(self, default_threads: int = 0) -> ServeSettings:
        """:meth:`base_settings`, then :meth:`complete`."""
        return self.complete(self.base_settings(default_threads))


def _validated(cls: Any, **values: Any) -> Any:
    """``cls(**values)`` with a validation error as one line (CLIError: exit 2)."""
    try:
        return cls(**values)
    except ValidationError as exc:
        errors = exc.errors()
        fields = {str(e["loc"][0]) for e in errors if e.get("loc")} if cls is ServeSettings \
            else set()
        named = sorted(filter(None, map(env_variable_set, fields)))
        where = f" (from {', '.join(named)})" if named else ""
        raise CLIError(f"invalid settings: {validation_message(errors)}{where}") from None
