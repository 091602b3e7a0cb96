"""OpenVINO backend: an exported ``.onnx`` or an IR ``.xml`` compiled for OpenVINO's CPU plugin,
opened through the runtime layer (:class:`irpe.runtime.openvino.file.OvFile`).

Precision (fp32 | bf16), threads and streams come from the model's config, completed with the
server's (:meth:`serve.config.ModelConfig.ov_options`).
"""
from __future__ import annotations

import logging

from irpe.artifact.files import read_file_info
from irpe.errors import InvalidInput
from irpe.runtime.openvino.core import check_precision, cpu_capabilities
from irpe.runtime.openvino.file import OvFile

from . import Artifact, FileBackend

__all__ = ["OpenVINOBackend"]

log = logging.getLogger("irpe.serve")


class OpenVINOBackend(FileBackend):
    """A compiled OpenVINO model and one infer request (the model's inference thread is the
    only caller); tensor names as in the export contract."""

    platform = "openvino"  # Triton's name for its OpenVINO backend

    def read_artifact(self) -> Artifact:
        """The file's spec and precision (int8 for an NNCF IR, else the configured one); first
        the checks that need no model loaded: OpenVINO installed, the options valid, bf16 only
        where the CPU has BF16 (so ``irpe serve`` stops with one line)."""
        self.options = self.cfg.ov_options(self.threads)
        try:
            check_precision(self.options.precision, cpu_capabilities())
        except ValueError as exc:
            raise InvalidInput(f"model {self.cfg.name}: {exc}") from None
        self.info = read_file_info(self.cfg.path)
        return Artifact(self.info.spec, "int8" if self.info.precision == "int8" else None)

    def load(self) -> None:
        self.file = OvFile(self.info, self.options)
        log.info("openvino model", extra={"model": self.cfg.name,
                                          "openvino": self.file.description})
