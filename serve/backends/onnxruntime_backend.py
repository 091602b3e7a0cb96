"""ONNX Runtime backend: files written by ``irpe export`` on CPU, CUDA or TensorRT EP."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Union

import numpy as np

from irpe.artifact.contract import onnx_precision, onnx_spec, read_onnx_props
from irpe.runtime.onnxruntime.session import GPU_PROVIDERS

from . import Artifact, Backend, output_names

__all__ = ["OnnxRuntimeBackend", "providers_for"]

log = logging.getLogger("irpe.serve")


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


class OnnxRuntimeBackend(Backend):
    """An ``onnxruntime.InferenceSession``; tensor names as in the export contract."""

    platform = "onnxruntime_onnx"

    def read_artifact(self) -> Artifact:
        """The spec and the weights' precision (int8: quantised) from one read of the file's
        metadata_props."""
        props = read_onnx_props(self.cfg.path)
        return Artifact(onnx_spec(props, self.cfg.path), onnx_precision(props))

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
        self.check_io([i.name for i in self.session.get_inputs()],
                      [o.name for o in self.session.get_outputs()])
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if wanted not in self.session.get_providers():
            log.warning("onnxruntime fell back from the first provider",
                        extra={"model": self.cfg.name, "wanted": wanted,
                               "active": self.session.get_providers()})

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        feeds = self.host_feeds(images, sizes)
        names = list(output_names(self.spec.task))
        return dict(zip(names, self.session.run(names, feeds), strict=True))

    def close(self) -> None:
        self.session = None
