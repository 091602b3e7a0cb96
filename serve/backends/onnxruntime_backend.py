"""ONNX Runtime backend: files written by ``irpe export`` on CPU, CUDA or TensorRT EP, opened
through the runtime layer (:class:`irpe.runtime.onnxruntime.file.OrtFile`)."""
from __future__ import annotations

import logging

from irpe.artifact.files import read_file_info
from irpe.runtime.onnxruntime.file import OrtFile, providers_for

from . import Artifact, FileBackend

__all__ = ["OnnxRuntimeBackend"]

log = logging.getLogger("irpe.serve")


class OnnxRuntimeBackend(FileBackend):
    """An ``onnxruntime.InferenceSession``; tensor names as in the export contract."""

    platform = "onnxruntime_onnx"

    def read_artifact(self) -> Artifact:
        """The spec and the weights' precision (int8: quantised) from one read of the file's
        metadata_props."""
        self.info = read_file_info(self.cfg.path)
        return Artifact(self.info.spec, self.info.precision)

    def load(self) -> None:
        import onnxruntime as ort
        providers = providers_for(self.cfg.providers, self.cfg.device,
                                  ort.get_available_providers())
        file = OrtFile(self.info, self.cfg.ort_options(), providers,
                       threads=self.threads or None, quiet=True)
        log.info("onnxruntime session", extra={"model": self.cfg.name,
                                               "irpe_ops": file.ops.describe()})
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if wanted not in file.session.get_providers():
            log.warning("onnxruntime fell back from the first provider",
                        extra={"model": self.cfg.name, "wanted": wanted,
                               "active": file.session.get_providers()})
        self.file = file
