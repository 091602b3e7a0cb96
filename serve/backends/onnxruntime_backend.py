"""ONNX Runtime backend: files written by ``irpe export`` on CPU, CUDA or TensorRT EP."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Union

import numpy as np

from irpe.artifact.contract import read_onnx_spec
from irpe.artifact.trained import ModelSpec

from . import Backend, input_names, output_names

__all__ = ["OnnxRuntimeBackend", "providers_for"]

log = logging.getLogger("irpe.serve")
_GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


def providers_for(configured: Optional[List[str]], device: str, available: List[str]
                  ) -> List[Union[str, tuple]]:
    """Execution providers in priority order (device id passed to the GPU ones)."""
    if configured:
        missing = [p for p in configured if p not in available]
        if missing:
            raise RuntimeError(f"onnxruntime providers {missing} are not in this build "
                               f"(available: {available})")
        names = list(configured)
    elif device == "cpu":
        names = ["CPUExecutionProvider"]
    else:
        names = [p for p in _GPU_PROVIDERS if p in available]
        if not names:
            raise RuntimeError(f"device {device} needs onnxruntime-gpu (CUDAExecutionProvider); "
                               f"this build has {available}")
        names.append("CPUExecutionProvider")
    device_id = int(device.partition(":")[2] or 0)
    return [(n, {"device_id": device_id}) if n in _GPU_PROVIDERS else n for n in names]


class OnnxRuntimeBackend(Backend):
    """An ``onnxruntime.InferenceSession``; tensor names as in the export contract."""

    platform = "onnxruntime_onnx"

    def read_spec(self) -> ModelSpec:
        from irpe.artifact.contract import onnx_precision, read_onnx_props
        self.file_precision = onnx_precision(read_onnx_props(self.cfg.path))  # int8: quantised
        return read_onnx_spec(self.cfg.path)

    def load(self) -> None:
        import onnxruntime as ort

        from irpe.runtime.onnxruntime.session import OrtOptions, create_session
        providers = providers_for(self.cfg.providers, self.cfg.device,
                                  ort.get_available_providers())
        options = OrtOptions().with_(self.cfg.ort_custom_ops, self.cfg.ort_ops_library,
                                     self.cfg.ort_rewrites)  # serve.config: model's, server's
        self.session, self.ops_path = create_session(
            self.cfg.path, providers, threads=self.threads or None, quiet=True, options=options)
        log.info("onnxruntime session", extra={"model": self.cfg.name,
                                               "irpe_ops": self.ops_path.describe()})
        self._check_names()
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if wanted not in self.session.get_providers():
            log.warning("onnxruntime fell back from the first provider",
                        extra={"model": self.cfg.name, "wanted": wanted,
                               "active": self.session.get_providers()})

    def _check_names(self) -> None:
        got_in = [i.name for i in self.session.get_inputs()]
        got_out = [o.name for o in self.session.get_outputs()]
        task = self.spec.task
        if set(got_in) != set(input_names(task)) or not set(output_names(task)) <= set(got_out):
            raise RuntimeError(f"{self.cfg.path}: inputs {got_in} / outputs {got_out} are not "
                               f"the {task} export contract ({list(input_names(task))} -> "
                               f"{list(output_names(task))})")

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        feeds = {"images": np.ascontiguousarray(images, dtype=np.float32)}
        if self.spec.task == "detection":
            feeds["sizes"] = np.ascontiguousarray(sizes, dtype=np.int64)
        names = list(output_names(self.spec.task))
        return dict(zip(names, self.session.run(names, feeds), strict=True))

    def close(self) -> None:
        self.session = None
