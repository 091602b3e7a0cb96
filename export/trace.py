"""The graph step of export.onnx.export_onnx: a loaded model -> its checked ONNX ModelProto, in
memory (export_onnx refuses bad requests, loads the model and writes the file).

Traced by torch's TorchScript-based exporter (fast, dynamic axes, custom-op symbolics;
docs/export.md says why not the dynamo exporter), optimised, each iRPE node given its
model-local function, the contract's metadata written, fully checked. Bucket ids are computed in
the graph (``irpe.set_traceable``), so a detection file is correct at every input size.
"""
from __future__ import annotations

import io
import json
import warnings
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Callable, Dict, Iterator, List, Tuple

import onnx
import torch
from torch import nn

import irpe
from irpe.artifact.contract import io_spec, onnx_metadata
from irpe.artifact.ops import DOMAIN, DOMAIN_VERSION
from irpe.rpe import iRPE, set_traceable

from . import symbolic
from .functions import GATHER, attach_functions, count_rpe_nodes, inline_functions, rpe_nodes
from .source import Source

__all__ = ["trace_model", "output_module", "Step", "MAX_IR_VERSION"]

MAX_IR_VERSION = 10  # onnxruntime 1.31 reads <= 13, TensorRT parsers expect <= 10
# wraps one labelled stage (export_onnx's progress timer); the default does nothing
Step = Callable[[str], AbstractContextManager[None]]


def _untimed(label: str) -> AbstractContextManager[None]:
    return nullcontext()


def trace_model(src: Source, opset: int, *, inline: bool = False, optimize: bool = True,
               step: Step = _untimed) -> onnx.ModelProto:
    """The checked ModelProto of ``src`` at ``opset`` (export_onnx has checked it against the
    contract): traced, optimised unless ``optimize`` is False, functions attached (inlined with
    ``inline``), metadata written. ``step(label)`` wraps each stage (export_onnx times them)."""
    with step(f"trace + convert (opset {opset})"):
        model = _trace(src, opset)
    if optimize:
        with step("optimize (fold constants, prune)"):
            model = _optimize(model)
    with step("functions, metadata, full check" + (", inline" if inline else "")):
        return _finalize(model, src, opset, inline)


class _Classifier(nn.Module):
    """images -> logits (distilled models: the eval average of both heads)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)


class _Detector(nn.Module):
    """(images, sizes) -> (pred_logits, pred_boxes); auxiliary decoder outputs are dropped."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, sizes: torch.Tensor):
        out = self.model(images, sizes)
        return out["pred_logits"], out["pred_boxes"]


def output_module(model: nn.Module, task: str) -> nn.Module:
    """The module whose inputs/outputs are the ONNX file's (used by export and validation)."""
    return (_Classifier if task == "classification" else _Detector)(model).eval()


def _example_inputs(src: Source) -> Tuple[torch.Tensor, ...]:
    """Trace inputs: batch 2; detection with one padded image so every masking op is traced."""
    if src.spec.task == "classification":
        size = getattr(getattr(src.model, "patch_embed", None), "img_size", None)
        size = size or src.spec.preprocess.get("size", 224)
        return (torch.randn(2, 3, size, size),)
    images = torch.randn(2, 3, 160, 224)
    return images, torch.tensor([[160, 224], [128, 150]])


@contextmanager
def _traceable(model: nn.Module, fixed_grid: bool) -> Iterator[None]:
    """In-graph bucket ids while exporting; the modules' previous settings are restored."""
    before = {m: (m.traceable, m.fixed_grid) for m in model.modules() if isinstance(m, iRPE)}
    set_traceable(model, True, fixed_grid=fixed_grid)
    try:
        yield
    finally:
        for module, (traceable, fixed) in before.items():
            module.traceable, module.fixed_grid = traceable, fixed


def _custom_opsets(model: nn.Module) -> Dict[str, int]:
    """{"irpe": 1} when the model has contextual iRPE (custom ops); else nothing to declare."""
    ctx = any(isinstance(m, iRPE) and m.mode == "contextual" for m in model.modules())
    return {DOMAIN: DOMAIN_VERSION} if ctx else {}


def _trace(src: Source, opset: int) -> onnx.ModelProto:
    """Run torch's TorchScript exporter into memory and return the raw ModelProto."""
    symbolic.register()
    wrapper = output_module(src.model, src.spec.task)
    inputs, outputs, dynamic = io_spec(src.spec.task)
    example = _example_inputs(src)
    buffer = io.BytesIO()
    fixed_grid = src.spec.task == "classification"  # static image size; detection: dynamic
    with _traceable(src.model, fixed_grid), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings on constant shapes, deprecation
        traced = wrapper(*example)  # first: fixed-grid ids are cached, so traced as constants
        # typed for paths; the TorchScript exporter (dynamo=False) writes to a file object too
        torch.onnx.export(wrapper, example, buffer, dynamo=False,  # type: ignore[arg-type]
                          opset_version=opset, input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic, custom_opsets=_custom_opsets(src.model))
    model = onnx.load_from_string(buffer.getvalue())
    traced = traced if isinstance(traced, tuple) else (traced,)
    _static_output_dims(model, [tuple(t.shape) for t in traced], dynamic)
    return model


def _static_output_dims(model: onnx.ModelProto, shapes: List[Tuple[int, ...]],
                        dynamic: Dict[str, Dict[int, str]]) -> None:
    """Write fixed sizes (queries, classes) into output dims the exporter left symbolic."""
    for output, shape in zip(model.graph.output, shapes, strict=True):
        dims = output.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if axis not in dynamic.get(output.name, {}) and axis < len(shape):
                dim.dim_value = shape[axis]


def _metadata(src: Source, opset: int, inline: bool, nodes: Dict[str, int]) -> Dict[str, str]:
    """The contract's keys (irpe.artifact.contract.onnx_metadata) plus this exporter's own."""
    meta = onnx_metadata(src.spec, getattr(src.model, "rpe_config", None), src.weights,
                         irpe.__version__)
    meta.update({
        "irpe.rpe_nodes": json.dumps(nodes), "irpe.inline": json.dumps(inline),
        "irpe.opset": str(opset),
        "irpe.exporter": f"torch.onnx TorchScript exporter, torch {torch.__version__}",
    })
    return meta


def _optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant folding and dead-code removal (onnxscript); irpe nodes are left as they are."""
    try:
        import onnxscript.optimizer
    except ImportError:  # the file stays correct, only less tidy
        warnings.warn("onnxscript is not installed: the graph is written unoptimized "
                      "(pip install onnxscript)", stacklevel=4)
        return model
    return onnxscript.optimizer.optimize(model, inline=False)


def _fill_num_buckets(model: onnx.ModelProto) -> None:
    """Give every RPEGather its ``num_buckets`` attribute: the table's last dim, which must be
    static (shape inference with data propagation over the folded graph)."""
    missing = [n for n in rpe_nodes(model)
               if n.op_type == GATHER and all(a.name != "num_buckets" for a in n.attribute)]
    if not missing:
        return
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    dims = {v.name: v.type.tensor_type.shape.dim for v in inferred.graph.value_info}
    for node in missing:
        table = dims.get(node.input[0])
        if not table or len(table) != 4 or not table[3].HasField("dim_value"):
            raise ValueError(f"{node.name}: the RPEGather table's bucket dimension must be "
                             "static to export")
        node.attribute.append(onnx.helper.make_attribute("num_buckets", table[3].dim_value))


def _finalize(model: onnx.ModelProto, src: Source, opset: int, inline: bool) -> onnx.ModelProto:
    """Attach functions (or inline them), cap the IR version, write metadata, full check."""
    _fill_num_buckets(model)
    attach_functions(model)
    nodes = count_rpe_nodes(model)
    if inline:
        model = inline_functions(model)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    model.producer_name, model.producer_version = "irpe-deploy", irpe.__version__
    model.doc_string = f"{src.spec.model_name} ({src.spec.task}) exported by irpe export"
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, _metadata(src, opset, inline, nodes))
    onnx.checker.check_model(model, full_check=True)
    return model
