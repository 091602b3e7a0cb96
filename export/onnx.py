"""PyTorch iRPE model -> ONNX file with RPEGather/RPEScatter nodes and local-function fallbacks.

Exported with torch's TorchScript-based exporter (fast, dynamic axes, custom-op symbolics; see
docs/export.md for why not the dynamo exporter). Bucket ids are computed in the graph
(``irpe.set_traceable``), so a detection file is correct at every input size.
"""
from __future__ import annotations

import io
import json
import os
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

import onnx
import torch
from torch import nn

import irpe
from irpe.artifact.contract import DEFAULT_OPSET, check_opset, io_spec, onnx_metadata
from irpe.artifact.trained import ModelSpec
from irpe.atomic import refuse_same_file, write_bytes
from irpe.rpe import iRPE, set_traceable

from . import symbolic
from .functions import GATHER, attach_functions, count_rpe_nodes, inline_functions, rpe_nodes
from .source import Source, SourceLike, load_source

__all__ = ["export_onnx", "export_model", "export_source", "prepare_source", "Exported",
           "output_module"]

MAX_IR_VERSION = 10  # onnxruntime 1.31 reads <= 13, TensorRT parsers expect <= 10


class Exported(NamedTuple):
    """A written ONNX file and the metadata_props written into it (no need to read it back)."""

    path: Path
    props: Dict[str, str]


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


class _Progress:
    """Step timing printed to stderr when enabled (the CLI turns it on)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.start = enabled, time.perf_counter()

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        if self.enabled:
            print(f"[export] {label:<34} {time.perf_counter() - t0:7.2f} s", file=sys.stderr,
                  flush=True)


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
    return {"irpe": 1} if ctx else {}


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
                      "(pip install onnxscript)", stacklevel=3)
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


def export_source(src: Source, output: Union[str, os.PathLike], *, inline: bool = False,
                  opset: int = DEFAULT_OPSET, progress: bool = False, optimize: bool = True
                  ) -> Exported:
    """Export an already resolved :class:`Source` (model + spec) to ``output``; the file and
    the metadata written into it. ``opset``: irpe.artifact.contract's MIN_OPSET..MAX_OPSET
    (ValueError else, before any work)."""
    check_opset(opset)
    return _write(src, output, inline, opset, progress, optimize)


def _write(src: Source, output: Union[str, os.PathLike], inline: bool, opset: int, progress: bool,
           optimize: bool) -> Exported:
    """export_source's work, for an opset already checked."""
    log = _Progress(progress)
    with log.step(f"trace + convert (opset {opset})"):
        model = _trace(src, opset)
    if optimize:
        with log.step("optimize (fold constants, prune)"):
            model = _optimize(model)
    with log.step("functions, metadata, full check" + (", inline" if inline else "")):
        model = _finalize(model, src, opset, inline)
    props = {p.key: p.value for p in model.metadata_props}
    output = Path(output)
    with log.step(f"write {output.name}"):
        write_bytes(output, model.SerializeToString())  # complete, metadata included, or nothing
    if progress:
        print(f"[export] total {time.perf_counter() - log.start:.2f} s, "
              f"{output.stat().st_size / 1e6:.1f} MB, rpe nodes {props['irpe.rpe_nodes']}",
              file=sys.stderr)
    return Exported(output, props)


def refuse_input_as_output(output: os.PathLike | str, source: object,
                           checkpoint: Optional[str] = None) -> None:
    """SameFileError (irpe.atomic) when ``output`` is the source or checkpoint file, before any
    work; a source that is a registered name or a module is no file and never matches."""
    files = [f for f in (source, checkpoint)
             if isinstance(f, (str, os.PathLike)) and os.path.isfile(f)]
    refuse_same_file(output, *files)


def prepare_source(source: SourceLike, checkpoint: Optional[str] = None,
                   spec: Optional[ModelSpec] = None, *, progress: bool = False) -> Source:
    """Resolve the model to export (timed on stderr with ``progress``)."""
    log = _Progress(progress)
    with log.step("load model"):
        src = load_source(source, checkpoint, spec)
    if progress:
        print(f"[export] {src.spec.model_name} ({src.spec.task}), weights {src.weights}",
              file=sys.stderr)
    return src


def export_model(source: SourceLike, output: Union[str, os.PathLike],
                 checkpoint: Optional[str] = None, *, inline: bool = False,
                 opset: int = DEFAULT_OPSET, progress: bool = False,
                 spec: Optional[ModelSpec] = None, optimize: bool = True) -> Exported:
    """Export a registry name (+ checkpoint), a trained-model file or a module (+ spec) to ONNX:
    the opset checked (before the model loads), :func:`prepare_source`, then the export; the
    file and the metadata written into it."""
    refuse_input_as_output(output, source, checkpoint)
    check_opset(opset)
    src = prepare_source(source, checkpoint, spec, progress=progress)
    return _write(src, output, inline, opset, progress, optimize)


def export_onnx(source: SourceLike, output: Union[str, os.PathLike],
                checkpoint: Optional[str] = None, *, inline: bool = False,
                opset: int = DEFAULT_OPSET, progress: bool = False,
                spec: Optional[ModelSpec] = None, optimize: bool = True) -> Path:
    """:func:`export_model`'s file path."""
    return export_model(source, output, checkpoint, inline=inline, opset=opset,
                        progress=progress, spec=spec, optimize=optimize).path
