"""An exported ``.onnx`` or an IR ``.xml`` compiled by OpenVINO's CPU plugin
(:class:`irpe.runtime.base.RuntimeFile`).

Compiled once with its dynamic axes (batch; height and width for DETR), so every batch size
and padded H, W runs on the same compiled model; the precision is set explicitly and read back
(:func:`irpe.runtime.openvino.session.compile_model`).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from irpe.artifact.files import FileInfo
from irpe.runtime.base import Feeds, RuntimeFile

from .session import OvOptions, compile_model, compiled_precision

__all__ = ["OvFile"]


def _dims(shape: Any) -> Tuple[Optional[int], ...]:
    """An OpenVINO partial shape with its dynamic axes as None."""
    return tuple(int(d.get_length()) if d.is_static else None for d in shape)


class OvFile(RuntimeFile):
    """A compiled OpenVINO model and one infer request (one caller at a time: each serving
    instance opens its own)."""

    runtime = "openvino"

    def __init__(self, info: FileInfo, options: Optional[OvOptions] = None,
                 shapes: Optional[Dict[str, Sequence[int]]] = None) -> None:
        super().__init__(info)
        self.compiled, self.description = compile_model(info.path, options, shapes)
        self.request = self.compiled.create_infer_request()
        self.inputs = tuple(i.get_any_name() for i in self.compiled.inputs)
        self.outputs = tuple(o.get_any_name() for o in self.compiled.outputs)
        self.precision = ("int8" if info.precision == "int8"
                          else compiled_precision(self.compiled))
        self.check_contract({o.get_any_name(): _dims(o.get_partial_shape())
                             for o in self.compiled.outputs})

    def run(self, feeds: Feeds, names: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        # inputs shared (infer is synchronous), outputs copied: the request reuses its buffers
        out = self.request.infer(feeds, share_inputs=True, share_outputs=False)
        return {name: out[name] for name in (names or self.outputs)}

    def close(self) -> None:
        self.request = self.compiled = None
