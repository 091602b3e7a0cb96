"""INT8 post-training quantisation of exported iRPE files with ONNX Runtime's quantisation tools.

Static (default): ``onnxruntime.quantization.quantize_static`` in QDQ format, int8 weights per
output channel, activation ranges calibrated on images read through the model's own
preprocessing (a folder of images, or the synthetic shapes set). Dynamic: ``quantize_dynamic``
(weights only, activations ranged at run time), the fallback when there is no data.

Only the layers with weights are quantised: Conv, Gemm and every MatMul by a 2-D weight (the
linear layers). The attention block's internals (q @ k^T, P @ v, the iRPE table products and
the RPEGather / RPEScatter nodes) stay float, so the file keeps its iRPE nodes and their
functions, and ``irpe.runtime.graph.rewrites`` fuses the block into one RPEAttention as in
fp32.
The quantisation is written into the file's metadata (irpe.artifact.contract), before the
file appears: the output is written beside its path and moved there complete (irpe.atomic), so
an interrupted run leaves nothing or a labelled int8 file, and the input is never the output.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from irpe.artifact.contract import (
    onnx_precision,
    quantization_metadata,
    read_onnx_props,
    read_onnx_spec,
)
from irpe.artifact.ops import DOMAIN
from irpe.atomic import atomic_path
from irpe.errors import InvalidInput
from irpe.outputs import check_outputs

from .calibration import SHAPES, calibration_feeds

if TYPE_CHECKING:
    from onnx import ModelProto

    from irpe.artifact.trained import ModelSpec

__all__ = ["QuantMode", "Target", "Activations", "CalibrationMethod", "QuantizeSettings",
           "quantize", "check_settings", "weight_nodes", "calibration_feeds", "SHAPES"]

QUANT_OPS = ("Conv", "Gemm", "MatMul")
DEFAULT_BATCH = 8  # calibration images per ONNX Runtime run when --batch is not given


class QuantMode(str, Enum):
    """static: calibrated activation ranges (QDQ); dynamic: ranges at run time, no data."""

    STATIC = "static"
    DYNAMIC = "dynamic"


class Target(str, Enum):
    """The runtime the file is made for. onnxruntime: asymmetric activations, int32 biases
    (ORT's QLinear kernels), static or dynamic. tensorrt: static QDQ only, symmetric int8
    activations (zero point 0) and float biases, the only forms TensorRT's ONNX parser accepts
    (dynamic mode's ConvInteger / MatMulInteger / DynamicQuantizeLinear it does not take).
    openvino: an OpenVINO IR quantised by NNCF (export/quantize_openvino.py)."""

    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"
    OPENVINO = "openvino"


class Activations(str, Enum):
    """The element type of the calibrated activations (static). For ONNX Runtime both are
    asymmetric, the same calibrated range and scale: uint8's zero point is int8's + 128, so the
    two files hold the same grid and differ only in the type, which picks ONNX Runtime's kernel
    (x86: uint8 activations x int8 weights is its VNNI / AVX2 fast path; docs/quantize.md,
    "uint8 activations"). For TensorRT (int8 only) activations are symmetric, zero point 0."""

    INT8 = "int8"
    UINT8 = "uint8"


class CalibrationMethod(str, Enum):
    """How calibration turns the observed activations into ranges (ORT's CalibrationMethod)."""

    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"


@dataclass(frozen=True)
class QuantizeSettings:
    """What ``irpe quantize`` does; recorded in the output's metadata."""

    mode: QuantMode = QuantMode.STATIC
    calibration: Optional[str] = SHAPES  # folder of images, or "shapes"; static only
    samples: int = 64  # calibration images
    batch: Optional[int] = None  # calibration images per run (None: DEFAULT_BATCH; NNCF: 1)
    method: CalibrationMethod = CalibrationMethod.MINMAX
    per_channel: bool = True
    input_layers: bool = False  # quantise the layers reading the model's input (see weight_nodes)
    target: Target = Target.ONNXRUNTIME
    activations: Activations = Activations.INT8  # static only
    seed: int = 0  # shapes set seed
    excluded: Sequence[str] = field(default_factory=tuple)  # more node names kept float

    @property
    def calibration_batch(self) -> int:
        """The calibration images per ONNX Runtime run: ``batch``, else :data:`DEFAULT_BATCH`."""
        return self.batch if self.batch is not None else DEFAULT_BATCH

    @property
    def activation_form(self) -> str:
        """What the file's activations are, as recorded: ``int8 asymmetric calibrated``,
        ``uint8 asymmetric calibrated``, ``int8 symmetric calibrated`` (TensorRT) or
        ``uint8 dynamic`` (ONNX Runtime's DynamicQuantizeLinear)."""
        if self.mode is QuantMode.DYNAMIC:
            return "uint8 dynamic"
        symmetry = "symmetric" if self.target is Target.TENSORRT else "asymmetric"
        return f"{self.activations.value} {symmetry} calibrated"

    def record(self, quantized: int, kept: int, weights: str,
               samples: Optional[int] = None) -> Dict:
        """The metadata record of a quantisation with this setting (``kept``: Conv/Gemm/MatMul
        nodes left float; ``samples``: the calibration images really used, which a folder of
        fewer images than ``self.samples`` makes smaller)."""
        out = {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items()}
        out["excluded"] = list(self.excluded)
        out["batch"] = self.calibration_batch
        if samples is not None:
            out["samples"] = samples
        if self.mode is QuantMode.DYNAMIC:
            for key in ("calibration", "samples", "batch", "method", "seed", "activations"):
                out.pop(key)
        out.update(format="QDQ" if self.mode is QuantMode.STATIC else "QOperator",
                   weights="int8 per-channel" if self.per_channel else "int8 per-tensor",
                   activations=self.activation_form,
                   quantized_nodes=quantized, float_nodes=kept, source_weights=weights)
        return out


def check_settings(settings: QuantizeSettings) -> None:
    """Refuse, before any work, combinations whose file the target could not read (or that
    would silently not do what they say); ValueError, one line."""
    static = settings.mode is QuantMode.STATIC
    if settings.target is Target.TENSORRT and not static:
        raise InvalidInput("--target tensorrt is for static quantisation: dynamic mode writes "
                         "ConvInteger / MatMulInteger / DynamicQuantizeLinear, which TensorRT "
                         "cannot parse (use --mode static --calibration DIR|shapes)")
    if settings.activations is Activations.UINT8 and (not static or
                                                       settings.target is Target.TENSORRT):
        raise InvalidInput("uint8 activations are for static quantisation for ONNX Runtime "
                         "(TensorRT takes symmetric int8 only; dynamic mode picks its own)")
    if static and not settings.calibration:
        raise InvalidInput("static quantisation needs a calibration set (a folder of images or "
                         f"'{SHAPES}'); --mode dynamic needs none")
    if settings.samples < 1 or settings.calibration_batch < 1:
        raise InvalidInput(f"calibration samples and batch must be >= 1, got {settings.samples}, "
                         f"{settings.batch}")
    if settings.target is Target.OPENVINO and (
            not static or settings.activations is Activations.UINT8 or
            settings.method is not CalibrationMethod.MINMAX or not settings.per_channel or
            settings.batch is not None):
        raise InvalidInput("--target openvino: NNCF picks activations, ranges and per-channel "
                         "weights itself and calibrates one image at a time; --mode dynamic, "
                         "--activations, --method, --per-tensor and --batch are for the ONNX "
                         "Runtime and TensorRT targets")
    empty = [name for name in settings.excluded if not name.strip()]
    if empty:
        raise InvalidInput("--exclude needs a node name, got an empty one")


def weight_nodes(model: ModelProto, excluded: Sequence[str] = (),
                 input_layers: bool = False) -> List[str]:
    """Names of the nodes to quantise: Conv, Gemm and MatMul by a 2-D initializer; MatMuls of
    two activations and by the iRPE tables ([1, 1, D, K]) stay float (attention internals), and
    unless ``input_layers`` so do the layers reading a model input (the image): an int8 grid
    over the normalised pixels is coarser than the pixels' own (docs/quantize.md)."""
    inits = {t.name: len(t.dims) for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    names = []
    for node in model.graph.node:
        if node.op_type not in QUANT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        if node.name in excluded or (not input_layers and node.input[0] in inputs):
            continue
        if node.op_type == "MatMul" and inits.get(node.input[1]) != 2:
            continue
        if node.op_type in ("Conv", "Gemm") and node.input[1] not in inits:
            continue
        names.append(node.name)
    return names


def _check_excluded(model: ModelProto, settings: QuantizeSettings) -> Tuple[str, ...]:
    """The ``--exclude`` names, each once; ValueError naming the valid ones when a name is not
    a layer this run would quantise (unknown, or float anyway): a typo must not pass as kept
    float, nor be recorded as such."""
    candidates = weight_nodes(model, (), settings.input_layers)
    wanted = tuple(dict.fromkeys(settings.excluded))
    bad = [name for name in wanted if name not in candidates]
    if bad:
        present = {n.name for n in model.graph.node}
        why = "; ".join(f"{name!r} is {'kept float anyway' if name in present else 'no node'}"
                        for name in bad)
        raise InvalidInput(f"--exclude: {why}; the layers this run quantises, which --exclude can "
                         f"keep float: {', '.join(candidates) or 'none'}")
    return wanted


def _name_nodes(model: ModelProto) -> None:
    """Give unnamed nodes a unique name (the quantiser selects nodes by name)."""
    taken = {n.name for n in model.graph.node if n.name}
    for k, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{k}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def _reader(feeds: List[Dict[str, np.ndarray]]):
    from onnxruntime.quantization import CalibrationDataReader

    class FeedReader(CalibrationDataReader):
        """Hands ORT's calibrator one batch of model inputs per call."""

        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> Optional[Dict[str, np.ndarray]]:
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = iter(feeds)

    return FeedReader()


def _run_ort(model: str, output: Path, settings: QuantizeSettings, nodes: List[str],
             feeds: List[Dict[str, np.ndarray]]) -> None:
    from onnxruntime import quantization as q
    if settings.mode is QuantMode.DYNAMIC:
        q.quantize_dynamic(model, output, op_types_to_quantize=list(QUANT_OPS),
                           per_channel=settings.per_channel, weight_type=q.QuantType.QInt8,
                           nodes_to_quantize=nodes)
        return
    method = {CalibrationMethod.MINMAX: q.CalibrationMethod.MinMax,
              CalibrationMethod.PERCENTILE: q.CalibrationMethod.Percentile,
              CalibrationMethod.ENTROPY: q.CalibrationMethod.Entropy}[settings.method]
    trt = settings.target is Target.TENSORRT
    q.quantize_static(model, output, _reader(feeds), quant_format=q.QuantFormat.QDQ,
                      op_types_to_quantize=list(QUANT_OPS), per_channel=settings.per_channel,
                      activation_type=q.QuantType.QUInt8
                      if settings.activations is Activations.UINT8 else q.QuantType.QInt8,
                      weight_type=q.QuantType.QInt8,
                      nodes_to_quantize=nodes, calibrate_method=method,
                      extra_options={"ActivationSymmetric": trt, "WeightSymmetric": True,
                                     "QuantizeBias": not trt})


def _read_source(source: Path):
    """The source file's metadata and spec; one-line errors for a folder, a missing or corrupt
    file, a file without irpe metadata and an already quantised file."""
    props = read_onnx_props(source)
    spec = read_onnx_spec(source)
    if onnx_precision(props) != "fp32":
        raise InvalidInput(f"{source} is already quantised ({onnx_precision(props)})")
    return props, spec


def quantize(model_path: os.PathLike | str, output: os.PathLike | str,
             settings: QuantizeSettings = QuantizeSettings()) -> Dict:
    """Quantise an exported file to int8 and write it to ``output``; returns the metadata
    record (:func:`irpe.artifact.contract.quantization_metadata`).

    Everything that can be refused is refused before any work (an output the write rule
    refuses: one of the input's files, an IR's .bin included, or a folder; option combinations,
    unknown --exclude names, an unreadable calibration set); the file appears at ``output``
    only complete, its metadata included (irpe.atomic)."""
    import onnx
    source, output = Path(model_path), Path(output)
    check_outputs([output], [source])
    check_settings(settings)
    props, spec = _read_source(source)
    if settings.target is Target.OPENVINO:
        return _openvino(source, output, settings, props, spec)
    model = onnx.load(source)
    _name_nodes(model)
    excluded = _check_excluded(model, settings)
    nodes = weight_nodes(model, excluded, settings.input_layers)
    if not nodes:
        raise InvalidInput(f"{source} has no Conv, Gemm or MatMul with weights to quantise")
    feeds: List[Dict[str, np.ndarray]] = []
    if settings.mode is QuantMode.STATIC:
        feeds = calibration_feeds(spec, settings.calibration or SHAPES, settings.samples,
                                  settings.calibration_batch, settings.seed)
    used = sum(len(feed["images"]) for feed in feeds)
    settings = replace(settings, excluded=excluded)
    with tempfile.TemporaryDirectory() as tmp, atomic_path(output) as part:
        work = Path(tmp) / "float.onnx"
        onnx.save(model, work)  # named nodes
        _run_ort(str(work), part, settings, nodes, feeds)
        return _finish(part, model, props, settings, nodes, used)


def _openvino(source: Path, output: Path, settings: QuantizeSettings, props: Dict[str, str],
              spec: ModelSpec) -> Dict:
    """``--target openvino``: NNCF, an OpenVINO IR; options that mean nothing there refused."""
    from irpe.artifact.openvino_ir import IR_SUFFIX

    from .quantize_openvino import quantize_openvino
    if output.suffix != IR_SUFFIX:
        raise InvalidInput(f"--target openvino writes an OpenVINO IR: name the output *{IR_SUFFIX} "
                         f"(its weights go beside it as .bin), not {output.name}")
    return quantize_openvino(source, output, settings, props, spec)


def _finish(output: Path, float_model: ModelProto, props: Dict[str, str],
            settings: QuantizeSettings, nodes: List[str], samples: int) -> Dict:
    """Put back what the quantiser may drop (the RPE functions, metadata, IR version) and
    record the quantisation (``samples``: calibration images used), rewriting ``output`` (the
    temporary file, not yet at its final path)."""
    import onnx
    quant = onnx.load(output)
    have = {(f.domain, f.name) for f in quant.functions}
    quant.functions.extend(f for f in float_model.functions if (f.domain, f.name) not in have)
    if not any(o.domain == DOMAIN for o in quant.opset_import):
        quant.opset_import.extend(o for o in float_model.opset_import if o.domain == DOMAIN)
    quant.ir_version = max(float_model.ir_version, min(quant.ir_version, 10))
    kept = sum(1 for n in float_model.graph.node if n.op_type in QUANT_OPS and n.name not in nodes)
    record = settings.record(len(nodes), kept, props.get("irpe.weights", ""), samples)
    meta = dict(props, **quantization_metadata("int8", record))
    del quant.metadata_props[:]
    for key, value in meta.items():
        quant.metadata_props.add(key=key, value=value)
    onnx.save(quant, output)
    return record
