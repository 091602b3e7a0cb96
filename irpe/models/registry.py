"""Model registry (timm-like): names -> builders, ``create_model`` with optional checkpoint."""
from __future__ import annotations

import difflib
import fnmatch
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Union

from torch import nn

from ..errors import InvalidInput, MissingFile, UnknownName

__all__ = ["ModelInfo", "register_model", "create_model", "list_models", "model_info"]


@dataclass(frozen=True)
class ModelInfo:
    """What the registry knows about a name: its builder, family and published figures."""

    name: str
    builder: Callable[..., nn.Module]
    family: str
    config: Dict = field(default_factory=dict)
    url: Optional[str] = None
    top1: Optional[float] = None
    preprocess: Dict = field(default_factory=dict)  # overrides of the family's eval transform
    weights: Optional[str] = None  # bundled weights file shipped in the package (demo models)

    @property
    def task(self) -> str:
        """``classification`` (DeiT/ViT) or ``detection`` (DETR)."""
        return "detection" if self.family == "detr" else "classification"


_REGISTRY: Dict[str, ModelInfo] = {}


def register_model(name: str, family: str, config: Optional[Dict] = None,
                   url: Optional[str] = None, top1: Optional[float] = None,
                   preprocess: Optional[Dict] = None, weights: Optional[str] = None
                   ) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering ``builder(**overrides) -> nn.Module`` under ``name``."""
    def wrap(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is registered twice")
        _REGISTRY[name] = ModelInfo(name, builder, family, dict(config or {}), url, top1,
                                    dict(preprocess or {}), weights)
        return builder
    return wrap


def list_models(pattern: str = "*") -> List[str]:
    """Registered names matching a shell-style pattern, sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def suggest(name: str, names: List[str], count: int = 3) -> List[str]:
    """Up to ``count`` names close to ``name`` (difflib ratio), those of the same family (the
    part before the first ``_``, e.g. ``deit``) first, so a typo stays within its family."""
    query, family = name.lower(), name.lower().split("_")[0]
    scored = []
    for candidate in names:
        same = candidate.lower().split("_")[0] == family
        ratio = difflib.SequenceMatcher(None, query, candidate.lower()).ratio()
        if ratio >= (0.4 if same else 0.6):
            scored.append((not same, -ratio, candidate))
    return [c for _, _, c in sorted(scored)[:count]]


def model_info(name: str) -> ModelInfo:
    """Registry entry for ``name``; unknown names raise UnknownName (a KeyError) listing close
    matches."""
    if name not in _REGISTRY:
        close = suggest(name, list(_REGISTRY))
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `irpe models`"
        raise UnknownName(f"unknown model {name!r}{hint}")
    return _REGISTRY[name]


def create_model(name: Union[str, ModelInfo], checkpoint: Optional[str] = None,
                 strict: bool = True, pretrained: bool = False, **overrides) -> nn.Module:
    """Build a registered model (its name, or its entry when already looked up), then load
    ``checkpoint`` (safetensors or weights-only .pth).

    ``pretrained=True`` loads the weights bundled with the package (demo models only); nothing
    is ever downloaded here (see ``irpe weights download``).
    """
    info = name if isinstance(name, ModelInfo) else model_info(name)
    name = info.name
    if pretrained and checkpoint is None:
        if info.weights is None:
            raise InvalidInput(f"{name} has no bundled weights; pass checkpoint= (official "
                             "checkpoints: `irpe weights download NAME`)")
        checkpoint = bundled_weights(info)
    model = info.builder(**overrides)
    # nn.Module.__setattr__ is typed Tensor | Module; a plain value is stored as any attribute
    model.model_name = name  # type: ignore[assignment]
    if checkpoint is not None:
        from ..checkpoint import load_checkpoint
        load_checkpoint(model, checkpoint, strict=strict)
    return model


def bundled_weights(info: ModelInfo) -> str:
    """Absolute path of a model's bundled weights (shipped under irpe/demo/)."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "demo", info.weights or "")
    if info.weights is None or not os.path.isfile(path):
        raise MissingFile(f"bundled weights of {info.name} missing: {path} (rebuild them "
                                "with `make demo-models`)")
    return path
