"""Inference backends behind one small interface (numpy in, numpy out).

Inputs: ``images`` float32 (B, 3, H, W) and, for detection, ``sizes`` int64 (B, 2) = valid
(h, w) of each padded image. Outputs: classification ``logits`` (B, C); detection
``pred_logits`` (B, Q, C+1) and ``pred_boxes`` (B, Q, 4) cx, cy, w, h relative to the valid
size. These are the export contract's tensor names (irpe.artifact.contract), so every backend
answers the same request the same.
"""
from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Dict, NamedTuple, Optional, Tuple

import numpy as np
import torch

from irpe.artifact.contract import input_names, output_names  # the export contract
from irpe.artifact.trained import ModelSpec
from irpe.data.transforms import normalize
from irpe.runtime.base import RuntimeFile

from ..registry import backend_factory, backend_names, register_backend

if TYPE_CHECKING:  # annotations only: the backends import without pydantic (tests/gpu on a bare
    from ..config import ModelConfig  # GPU image, where the serving stack is not installed)

__all__ = ["Artifact", "Backend", "FileBackend", "backend_names", "create_backend", "input_names",
           "output_names", "register_backend"]


class Artifact(NamedTuple):
    """What a backend reads from its file at construction, without loading weights."""

    spec: ModelSpec  # task, labels, preprocessing
    precision: Optional[str] = None  # the precision the file fixes (ONNX: fp32, or int8 when
    # quantised); None: the model runs in the configured one (ModelConfig.run_precision)


class Backend(ABC):
    """A model artifact on one runtime. ``spec`` and ``file_precision`` are read cheaply at
    construction (validation); ``load`` does the heavy work and runs in the model's worker
    thread."""

    platform = "unknown"  # Open Inference Protocol model metadata

    def __init__(self, cfg: ModelConfig, threads: int = 0) -> None:
        self.cfg, self.threads = cfg, threads
        artifact = self.read_artifact()
        self.spec: ModelSpec = artifact.spec
        self.file_precision: Optional[str] = artifact.precision

    @abstractmethod
    def read_artifact(self) -> Artifact:
        """The artifact's ModelSpec and the precision its file fixes, without loading weights."""

    @abstractmethod
    def load(self) -> None:
        """Build the model / session / engine on the configured device."""

    @abstractmethod
    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        """Run one batch; see the module docstring for names, shapes and types."""

    def infer_uint8(self, images: np.ndarray, sizes: Optional[np.ndarray]
                    ) -> Dict[str, np.ndarray]:
        """One batch of uint8 (B, 3, H, W) pixels (decoded images, padding 0), normalised
        (irpe.data.transforms.normalize) here on the host; the torch backend does it on its
        device."""
        mean, std = self.mean_std
        return self.infer(normalize(images, mean, std, sizes), sizes)

    @functools.cached_property
    def mean_std(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The artifact's mean and std as float32 CPU tensors, built once, not per batch."""
        pre = self.spec.transform()
        return (torch.tensor(pre.mean, dtype=torch.float32),
                torch.tensor(pre.std, dtype=torch.float32))

    def warmup(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        """First batch after loading (allocations, kernel selection); readiness waits for it."""
        return self.infer(images, sizes)

    def close(self) -> None:  # noqa: B027 - a default, not abstract: not every runtime holds any
        """Release the runtime's resources."""


class FileBackend(Backend):
    """A backend whose model is an exported file opened through the runtime layer
    (:class:`irpe.runtime.base.RuntimeFile`): ``load`` sets ``file``; inference runs it on
    host arrays."""

    file: Optional[RuntimeFile] = None

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        if self.file is None:
            raise RuntimeError(f"model {self.cfg.name}: the backend is closed")
        return self.file.run(self.file.feeds(images, sizes), output_names(self.spec.task))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file = None


def create_backend(cfg: ModelConfig, threads: int = 0) -> Backend:
    """The backend ``cfg.backend`` names (serve.registry), constructed (spec read, nothing
    loaded)."""
    return backend_factory(cfg.backend)(cfg, threads)
