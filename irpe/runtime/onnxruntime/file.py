"""An exported (or quantised) ``.onnx`` opened on ONNX Runtime
(:class:`irpe.runtime.base.RuntimeFile`)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from irpe.artifact.files import FileInfo
from irpe.runtime.base import Feeds, RuntimeFile

from .session import GPU_PROVIDERS, OrtOptions, create_session

__all__ = ["OrtFile", "providers_for"]


def providers_for(configured: Optional[List[str]], device: str, available: List[str]
                  ) -> List[Union[str, tuple]]:
    """Execution providers in priority order (device id passed to the GPU ones): the
    configured list, else CPU on device cpu, else those of GPU_PROVIDERS this build has, then
    CPU."""
    if configured:
        missing = [p for p in configured if p not in available]
        if missing:
            raise RuntimeError(f"onnxruntime providers {missing} are not in this build "
                               f"(available: {available})")
        names = list(configured)
    elif device == "cpu":
        names = ["CPUExecutionProvider"]
    else:
        names = [p for p in GPU_PROVIDERS if p in available]
        if not names:
            raise RuntimeError(f"device {device} needs onnxruntime-gpu (CUDAExecutionProvider); "
                               f"this build has {available}")
        names.append("CPUExecutionProvider")
    device_id = int(device.partition(":")[2] or 0)
    return [(n, {"device_id": device_id}) if n in GPU_PROVIDERS else n for n in names]


def _dims(shape: Sequence[Any]) -> Tuple[Optional[int], ...]:
    """An ORT shape with its symbolic axes as None."""
    return tuple(d if isinstance(d, int) else None for d in shape)


class OrtFile(RuntimeFile):
    """An ``onnxruntime.InferenceSession`` of the file, made by
    :func:`irpe.runtime.onnxruntime.session.create_session` as ``options`` say (the custom-op
    library where found); ``ops`` says which path runs the iRPE nodes."""

    runtime = "onnxruntime"

    def __init__(self, info: FileInfo, options: Optional[OrtOptions] = None,
                 providers: Optional[List] = None, threads: Optional[int] = None,
                 quiet: bool = False) -> None:
        import onnxruntime as ort
        super().__init__(info)
        self.session, self.ops = create_session(info.path, providers, threads=threads,
                                                options=options, quiet=quiet)
        self.inputs = tuple(i.name for i in self.session.get_inputs())
        self.outputs = tuple(o.name for o in self.session.get_outputs())
        self.precision = info.precision
        active = self.session.get_providers()
        self.description = (f"onnxruntime {ort.__version__} ({', '.join(active)}; "
                            f"{self.ops.describe()})")
        self.check_contract({o.name: _dims(o.shape) for o in self.session.get_outputs()})

    def run(self, feeds: Feeds, names: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        wanted = list(names or self.outputs)
        return dict(zip(wanted, self.session.run(wanted, feeds), strict=True))

    def close(self) -> None:
        self.session = None
