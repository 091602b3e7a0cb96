"""TensorRT backend: a serialized engine (+ iRPE plugin libraries) run by
``irpe.runtime.tensorrt.runner.TRTRunner``; needs a CUDA GPU and a TensorRT Python module."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

import numpy as np

from irpe.artifact.contract import engine_spec, read_onnx_spec
from irpe.artifact.trained import ModelSpec, read_spec
from irpe.errors import MissingFile

from . import Artifact, Backend, output_names

if TYPE_CHECKING:  # TensorRT is imported by load() (the module may be absent)
    from irpe.runtime.tensorrt.runner import TRTRunner

__all__ = ["TensorRTBackend"]


class TensorRTBackend(Backend):
    """Adapter from the backend interface to ``TRTRunner(engine, plugins, device)``."""

    platform = "tensorrt_plan"
    runner: Optional[TRTRunner]  # set by load(), released by close()

    def read_artifact(self) -> Artifact:
        """The spec from ``metadata`` (.safetensors / .onnx) or the engine's JSON sidecar; no
        file precision (listings show the configured one)."""
        return Artifact(self._read_spec())

    def _read_spec(self) -> ModelSpec:
        if self.cfg.metadata is not None:
            if Path(self.cfg.metadata).suffix == ".safetensors":
                return read_spec(str(self.cfg.metadata))[0]
            return read_onnx_spec(self.cfg.metadata)
        try:
            return engine_spec(self.cfg.path)
        except FileNotFoundError as exc:
            raise MissingFile(f"model {self.cfg.name}: {exc}; set metadata: to the "
                              "exported .onnx") from None

    def load(self) -> None:
        if self.cfg.device == "cpu":
            raise RuntimeError(f"model {self.cfg.name}: the tensorrt backend needs device cuda")
        import torch
        try:
            from irpe.runtime.tensorrt.runner import TRTRunner
            self.runner = TRTRunner(str(self.cfg.path), plugins=[str(p) for p in self.cfg.plugins],
                                    device=torch.device(self.cfg.device))
        except ImportError as exc:  # no TensorRT module
            raise RuntimeError(f"model {self.cfg.name}: the tensorrt backend needs TensorRT: "
                               f"{exc}") from None
        self.torch = torch

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        feeds = {"images": self.torch.from_numpy(images)}
        if self.spec.task == "detection":
            feeds["sizes"] = self.torch.from_numpy(sizes)
        if self.runner is None:
            raise RuntimeError(f"model {self.cfg.name}: the backend is closed")
        out = self.runner(**feeds)
        return {k: out[k].float().cpu().numpy() for k in output_names(self.spec.task)}

    def close(self) -> None:
        self.runner = None
