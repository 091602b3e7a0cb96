"""ONNX Runtime backend: files written by ``irpe export`` on CPU, CUDA or TensorRT EP, opened
through the runtime layer (:class:`irpe.runtime.onnxruntime.file.OrtFile`)."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np

from irpe.artifact.files import read_file_info
from irpe.runtime.onnxruntime.file import OrtFile, providers_for

from . import Artifact, Backend, output_names

__all__ = ["OnnxRuntimeBackend"]

log = logging.getLogger("irpe.serve")


class OnnxRuntimeBackend(Backend):
    """An ``onnxruntime.InferenceSession``; tensor names as in the export contract."""

    platform = "onnxruntime_onnx"
    file: Optional[OrtFile] = None

    def read_artifact(self) -> Artifact:
        """The spec and the weights' precision (int8: quantised) from one read of the file's
        metadata_props."""
        self.info = read_file_info(self.cfg.path)
        return Artifact(self.info.spec, self.info.precision)

    def load(self) -> None:
        import onnxruntime as ort
        providers = providers_for(self.cfg.providers, self.cfg.device,
                                  ort.get_available_providers())
        self.file = OrtFile(self.info, self.cfg.ort_options(), providers,
                            threads=self.threads or None, quiet=True)
        log.info("onnxruntime session", extra={"model": self.cfg.name,
                                               "irpe_ops": self.file.ops.describe()})
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if wanted not in self.file.session.get_providers():
            log.warning("onnxruntime fell back from the first provider",
                        extra={"model": self.cfg.name, "wanted": wanted,
                               "active": self.file.session.get_providers()})

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        if self.file is None:
            raise RuntimeError(f"model {self.cfg.name}: the backend is closed")
        return self.file.run(self.file.feeds(images, sizes), output_names(self.spec.task))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file = None
