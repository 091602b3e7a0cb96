"""INT8 post-training quantisation for OpenVINO with NNCF: an exported file -> an OpenVINO IR.

``irpe quantize --target openvino``. The exported file is read by
:func:`irpe.runtime.openvino.session.open_model` as the runtime reads it: with the iRPE OpenVINO
library where it is built (``$IRPE_OV_OPS`` / ``$IRPE_OV_OPS_LIBRARY``; its RPEAttention
blocks then stay float32 ops of the IR, which reads back only with that library: the record's
``irpe_ops`` says which), else with the iRPE ops converted by
:mod:`irpe.runtime.openvino.frontend` (OpenVINO's own float ops), calibrated by
``nncf.quantize`` with ``ModelType.TRANSFORMER`` on images read through the model's own
preprocessing (:func:`export.calibration.calibration_feeds`), and written as an IR
(``.xml`` + ``.bin``) carrying the export contract's metadata in its ``rt_info``
(:mod:`irpe.artifact.openvino_ir`; its ``write_ir`` records the ``.bin``'s digest, so no
reader pairs an ``.xml`` with another run's weights). OpenVINO's CPU plugin runs the
FakeQuantize layers NNCF inserts with its int8 kernels (VNNI where the CPU has it).

Why an IR and not a QDQ ONNX file: NNCF's OpenVINO backend places the quantisers for
OpenVINO's fusions (its transformer patterns, SmoothQuant) and the IR loads without any
conversion step; the file records its format so every reader knows what it holds.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence

from irpe.artifact.contract import quantization_metadata
from irpe.errors import InvalidInput

if TYPE_CHECKING:
    import openvino

    from irpe.artifact.trained import ModelSpec


__all__ = ["IR_FORMAT", "quantize_openvino", "input_layer_names"]

IR_FORMAT = "OpenVINO IR"


class Settings(Protocol):
    """What this quantiser reads of ``export.quantize.QuantizeSettings`` (structural, so this
    module does not import the one that dispatches to it)."""

    @property
    def calibration(self) -> Optional[str]: ...

    @property
    def samples(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def input_layers(self) -> bool: ...

    @property
    def excluded(self) -> Sequence[str]: ...

    def record(self, quantized: int, kept: int, weights: str) -> Dict: ...


def input_layer_names(model: "openvino.Model") -> List[str]:
    """Friendly names of the layers with weights that read a model input (the image): kept
    float, as for ONNX Runtime (an int8 grid over normalised pixels is coarser than theirs)."""
    names = []
    for param in model.get_parameters():
        for target in param.output(0).get_target_inputs():
            node = target.get_node()
            if node.get_type_name() in ("Convolution", "MatMul"):
                names.append(node.get_friendly_name())
    return names


def _check_excluded(model: "openvino.Model", excluded: List[str]) -> None:
    """Refuse names of --exclude that are not layers of the model (nothing silently ignored)."""
    names = {op.get_friendly_name() for op in model.get_ops()}
    unknown = [name for name in excluded if name not in names]
    if unknown:
        raise InvalidInput(f"--exclude {', '.join(unknown)}: no such layer in the model")


def quantize_openvino(source: Path, output: Path, settings: "Settings",
                      props: Dict[str, str], spec: "ModelSpec") -> Dict:
    """Calibrate and quantise ``source`` for OpenVINO; write the IR to ``output`` (``.xml``,
    weights beside it) atomically; returns the metadata record."""
    from irpe.runtime.openvino.core import OpenVINOUnavailable
    try:
        import nncf
    except ImportError as exc:  # the runtime extra without the quantiser
        raise OpenVINOUnavailable(f"irpe quantize --target openvino needs NNCF ({exc}): pip "
                                  "install 'irpe-deploy[nncf]'") from None

    from irpe.artifact.openvino_ir import set_ir_props, write_ir
    from irpe.runtime.openvino.library import attention_precision, set_attention_precision
    from irpe.runtime.openvino.session import OvOptions, open_model

    from .calibration import SHAPES, calibration_feeds

    model, _, irpe_ops = open_model(source, OvOptions.from_env())
    # the library's attention blocks run their products in bf16 (AVX512_BF16) in an int8 IR,
    # as OpenVINO's own attention runs in int8 there; calibrated as it will run
    fused = set_attention_precision(model, "int8")
    _check_excluded(model, list(settings.excluded))
    ignored = list(settings.excluded)
    if not settings.input_layers:
        ignored += input_layer_names(model)
    feeds = calibration_feeds(spec, settings.calibration or SHAPES, settings.samples, 1,
                              settings.seed)
    nncf.set_log_level(logging.ERROR)
    with contextlib.redirect_stdout(sys.stderr):  # NNCF's progress bars: never on stdout
        quantized = nncf.quantize(model, nncf.Dataset(feeds),
                                  model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds),
                                  ignored_scope=nncf.IgnoredScope(names=ignored, validate=False))
    record = settings.record(_count_int8_weights(quantized), len(ignored),
                             props.get("irpe.weights", ""))
    record.update(format=IR_FORMAT, samples=len(feeds), batch=1,
                  method="NNCF transformer preset (min-max ranges, SmoothQuant, fast bias "
                         "correction)",
                  weights="int8 per-channel (NNCF)",
                  activations="calibrated by NNCF (mixed preset)",
                  engine=f"nncf {nncf.__version__}", irpe_ops=irpe_ops)
    if fused:
        record["attention_precision"] = attention_precision("int8")
    set_ir_props(quantized, dict(props, **quantization_metadata("int8", record)))
    write_ir(quantized, output)  # .bin then .xml, the .xml recording its .bin's digest
    return record


def _count_int8_weights(model: "openvino.Model") -> int:
    """Weight tensors NNCF stored as int8 (each decompressed by one Convert)."""
    import openvino as ov
    count = 0
    for op in model.get_ops():
        if op.get_type_name() != "Convert":
            continue
        source = op.input_value(0)
        if source.get_node().get_type_name() == "Constant" and \
                source.get_element_type() == ov.Type.i8:
            count += 1
    return count
