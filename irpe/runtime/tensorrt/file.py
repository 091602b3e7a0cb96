"""A serialized TensorRT engine opened on a CUDA GPU (:class:`irpe.runtime.base.RuntimeFile`):
host arrays in and out around :class:`irpe.runtime.tensorrt.runner.TRTRunner`."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import torch

from irpe.artifact.files import FileInfo
from irpe.runtime.base import Feeds, RuntimeFile

from .runner import TRTRunner

__all__ = ["EngineFile"]


class EngineFile(RuntimeFile):
    """The engine with ``plugins`` loaded on ``device``; ``precision`` is the one it was built
    in (its sidecar), or the file's."""

    runtime = "tensorrt"

    def __init__(self, info: FileInfo, plugins: Sequence[str] = (),
                 device: Optional[torch.device] = None, precision: Optional[str] = None) -> None:
        super().__init__(info)
        self.runner = TRTRunner(info.path, plugins=plugins, device=device)
        self.inputs = tuple(self.runner.input_names)
        self.outputs = tuple(self.runner.output_names)
        self.precision = precision or info.precision
        self.description = f"{self.runner.trt.__name__} {self.runner.trt.__version__}"
        engine = self.runner.engine
        self.check_contract({n: tuple(d if d >= 0 else None for d in engine.get_tensor_shape(n))
                             for n in self.outputs})

    def run_tensors(self, feeds: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """One batch of torch tensors (any device) -> outputs on the engine's device, produced
        on its current stream (the serving backend keeps them there until it copies)."""
        return self.runner(**feeds)

    def run(self, feeds: Feeds, names: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        out = self.run_tensors({k: torch.from_numpy(v) for k, v in feeds.items()})
        torch.cuda.current_stream(self.runner.device).synchronize()
        return {k: out[k].float().cpu().numpy() for k in (names or self.outputs)}

    def close(self) -> None:
        self.runner = None  # type: ignore[assignment]
