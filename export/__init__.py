"""torch -> ONNX export of iRPE models (RPE nodes + local functions), validation, quantisation,
Triton model repositories.

Submodules: ``onnx`` (``export_onnx``, the one export entry point; its graph step is ``trace``),
``validate``, ``quantize``, ``triton_repo``, ``cli`` (which also wires ``irpe build-engine`` to
irpe.runtime.tensorrt.build). Import them directly; this package imports no exporter module, it
only registers the ``onnx`` exporter with irpe.artifact.exporters (how serve's demo has files
exported without importing export/).
"""
from pathlib import Path as _Path

from irpe.artifact import exporters


def _write_onnx(source: str, output: _Path) -> _Path:
    """irpe's ``onnx`` exporter (serve's demo uses it without importing this package)."""
    from .onnx import export_onnx
    return export_onnx(source, output)


exporters.register_exporter("onnx", _write_onnx, sources=(_Path(__file__).parent,))
