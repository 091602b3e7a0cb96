"""OpenVINO backend: an exported ``.onnx`` (iRPE ops converted by OpenVINO's frontend) or an IR
``.xml`` compiled for OpenVINO's CPU plugin by :mod:`irpe.runtime.openvino.session`.

The model is compiled once with its dynamic axes (batch; height and width for DETR), so every
batch size and, for detection, every padded H, W runs on the same compiled model. Precision
(fp32 | bf16), threads and streams come from the model's config, completed with the server's
(serve.config); the precision is set explicitly and read back from the compiled model.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import numpy as np

from irpe.artifact.contract import onnx_precision, read_onnx_props, read_onnx_spec
from irpe.artifact.openvino_ir import is_ir, read_ir_props, read_ir_spec
from irpe.errors import InvalidInput

from . import Artifact, Backend, output_names

__all__ = ["OpenVINOBackend"]

log = logging.getLogger("irpe.serve")


class OpenVINOBackend(Backend):
    """A compiled OpenVINO model and one infer request (the model's inference thread is the
    only caller); tensor names as in the export contract."""

    platform = "openvino"  # Triton's name for its OpenVINO backend

    def read_artifact(self) -> Artifact:
        """The file's spec and precision (int8 for an NNCF IR, else the configured one); first
        the checks that need no model loaded: OpenVINO installed, the options valid, bf16 only
        where the CPU has BF16 (so ``irpe serve`` stops with one line)."""
        from irpe.runtime.openvino.session import check_precision, cpu_capabilities
        self.options = self._options()
        try:
            check_precision(self.options.precision, cpu_capabilities())
        except ValueError as exc:
            raise InvalidInput(f"model {self.cfg.name}: {exc}") from None
        ir = is_ir(self.cfg.path)
        props = read_ir_props(self.cfg.path) if ir else read_onnx_props(self.cfg.path)
        precision = "int8" if onnx_precision(props) == "int8" else None  # /v1/models
        spec = read_ir_spec(self.cfg.path) if ir else read_onnx_spec(self.cfg.path)
        return Artifact(spec, precision)

    def _options(self) -> Any:
        """OvOptions of this model: its config (completed by ServeSettings), else the server
        defaults; OpenVINOUnavailable (one line naming the extra) without the package."""
        from irpe.runtime.openvino.session import OvOptions, import_openvino

        from ..config import ServeSettings
        import_openvino()
        threads = self.threads if self.cfg.ov_threads is None else self.cfg.ov_threads
        streams = (ServeSettings.model_fields["ov_streams"].default
                   if self.cfg.ov_streams is None else self.cfg.ov_streams)
        return OvOptions(self.cfg.run_precision(), threads, streams, "latency",
                         ops=self.cfg.ov_ops or "auto",
                         library=str(self.cfg.ov_ops_library or ""))

    def load(self) -> None:
        from irpe.runtime.openvino.session import compile_model
        self.compiled, self.description = compile_model(self.cfg.path, self.options)
        log.info("openvino model", extra={"model": self.cfg.name, "openvino": self.description})
        self.check_io([i.get_any_name() for i in self.compiled.inputs],
                      [o.get_any_name() for o in self.compiled.outputs])
        self.request = self.compiled.create_infer_request()

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        feeds = self.host_feeds(images, sizes)
        # inputs shared (infer is synchronous), outputs copied: the request reuses its buffers
        out = self.request.infer(feeds, share_inputs=True, share_outputs=False)
        return {name: out[name] for name in output_names(self.spec.task)}

    def close(self) -> None:
        self.request = self.compiled = None
