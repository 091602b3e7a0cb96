"""Inference backends behind one small interface (numpy in, numpy out).

Inputs: ``images`` float32 (B, 3, H, W) and, for detection, ``sizes`` int64 (B, 2) = valid
(h, w) of each padded image. Outputs: classification ``logits`` (B, C); detection
``pred_logits`` (B, Q, C+1) and ``pred_boxes`` (B, Q, 4) cx, cy, w, h relative to the valid
size. These are the export contract's tensor names (irpe.artifact.contract), so every backend
answers the same request the same.
"""
from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

import numpy as np

from irpe.artifact.trained import ModelSpec
from irpe.artifact.contract import input_names, output_names  # the export contract

if TYPE_CHECKING:  # (the config needs pydantic; serve.backends.cuda_graphs is used without it)
    from ..config import ModelConfig

__all__ = ["Backend", "backend_names", "create_backend", "input_names", "output_names",
           "register_backend"]

_CLASSES = {"torch": "serve.backends.torch_backend:TorchBackend",
            "onnxruntime": "serve.backends.ort_backend:OrtBackend",
            "tensorrt": "serve.backends.trt_backend:TensorRTBackend"}
_BUILTIN = frozenset(_CLASSES)
Factory = Callable[["ModelConfig", int], "Backend"]
_FACTORIES: Dict[str, Factory] = {}


class Backend(ABC):
    """A model artifact on one runtime. ``spec`` is read cheaply at construction (validation);
    ``load`` does the heavy work and runs in the model's worker thread."""

    platform = "unknown"  # Open Inference Protocol model metadata

    def __init__(self, cfg: ModelConfig, threads: int = 0) -> None:
        self.cfg, self.threads = cfg, threads
        self.spec: ModelSpec = self.read_spec()

    @abstractmethod
    def read_spec(self) -> ModelSpec:
        """The artifact's ModelSpec (task, labels, preprocessing) without loading weights."""

    @abstractmethod
    def load(self) -> None:
        """Build the model / session / engine on the configured device."""

    @abstractmethod
    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        """Run one batch; see the module docstring for names, shapes and types."""

    def infer_uint8(self, images: np.ndarray, sizes: Optional[np.ndarray]
                    ) -> Dict[str, np.ndarray]:
        """One batch of uint8 (B, 3, H, W) pixels (decoded images, padding 0): normalised with
        the artifact's mean/std here on the host; the torch backend does it on its device."""
        from ..preprocess_pool import normalize
        mean, std = self._host_mean_std
        return self.infer(normalize(images, mean, std, sizes), sizes)

    @functools.cached_property
    def _host_mean_std(self) -> Tuple[np.ndarray, np.ndarray]:
        """The artifact's mean and std as float32 (1, 3, 1, 1), built once, not per batch."""
        pre = self.spec.transform()
        return (np.asarray(pre.mean, np.float32).reshape(1, 3, 1, 1),
                np.asarray(pre.std, np.float32).reshape(1, 3, 1, 1))

    def warmup(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        """First batch after loading (allocations, kernel selection); readiness waits for it."""
        return self.infer(images, sizes)

    def close(self) -> None:
        """Release the runtime's resources."""


def register_backend(name: str, factory: Factory) -> None:
    """Make ``backend: NAME`` usable in model configs (plug-ins, test doubles); the built-in
    names cannot be replaced. ``factory(cfg, threads)`` returns a Backend."""
    if name in _BUILTIN:
        raise ValueError(f"backend {name!r} is built in and cannot be replaced")
    _FACTORIES[name] = factory


def backend_names() -> Tuple[str, ...]:
    """Built-in and registered backend names."""
    return tuple(_CLASSES) + tuple(sorted(_FACTORIES))


def create_backend(cfg: ModelConfig, threads: int = 0) -> Backend:
    """The backend ``cfg.backend`` names, constructed (spec read, nothing loaded)."""
    if cfg.backend in _FACTORIES:
        return _FACTORIES[cfg.backend](cfg, threads)
    module, _, name = _CLASSES[cfg.backend].partition(":")
    return getattr(importlib.import_module(module), name)(cfg, threads)
