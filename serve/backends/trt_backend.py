"""TensorRT backend: a serialized engine (+ iRPE plugin library) run by
``export.tensorrt.TRTRunner``; needs a GPU and the TensorRT Python module."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import numpy as np

from irpe.artifact import ModelSpec, read_spec

from . import Backend, output_names

__all__ = ["TensorRTBackend"]


class TensorRTBackend(Backend):
    """Adapter from the backend interface to ``TRTRunner(engine, plugins, device)``."""

    platform = "tensorrt_plan"

    def read_spec(self) -> ModelSpec:
        source = Path(self.cfg.metadata or Path(self.cfg.path).with_suffix(".onnx"))
        if source.suffix == ".safetensors":
            return read_spec(str(source))[0]
        from export.onnx import read_metadata
        return read_metadata(str(source))

    def load(self) -> None:
        if self.cfg.device == "cpu":
            raise RuntimeError(f"model {self.cfg.name}: the tensorrt backend needs device cuda")
        try:
            from export.tensorrt import TRTRunner
        except ImportError as exc:
            raise RuntimeError(f"model {self.cfg.name}: the tensorrt backend needs TensorRT "
                               f"and export/tensorrt.py ({exc})") from None
        device = int(self.cfg.device.partition(":")[2] or 0)
        self.runner = TRTRunner(str(self.cfg.path), plugins=[str(p) for p in self.cfg.plugins],
                                device=device)

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        feeds = {"images": np.ascontiguousarray(images, dtype=np.float32)}
        if self.spec.task == "detection":
            feeds["sizes"] = np.ascontiguousarray(sizes, dtype=np.int64)
        out = self.runner.infer(feeds)
        return {k: np.asarray(out[k], dtype=np.float32) for k in output_names(self.spec.task)}

    def close(self) -> None:
        self.runner = None
