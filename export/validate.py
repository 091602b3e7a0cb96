"""Compare an exported ONNX file (ONNX Runtime or OpenVINO), an OpenVINO IR or a TensorRT engine
against the PyTorch model.

Every element must satisfy |got - expected| <= atol + rtol * |expected| (tolerances per
precision). The report adds max abs / rel error, cosine similarity, top-1/top-5 agreement
(classification) or box L1, score and label agreement (detection), and names the outputs and
inputs with the worst errors.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from irpe.artifact.contract import onnx_precision, sidecar_path
from irpe.artifact.files import FileInfo, file_kind, read_props
from irpe.artifact.trained import spec_from_metadata
from irpe.atomic import write_text
from irpe.errors import InvalidInput, MissingFile
from irpe.runtime.base import RuntimeFile
from irpe.runtime.onnxruntime.session import OrtOptions
from irpe.runtime.openvino.session import OvOptions
from irpe.runtime.pick import open_file, pick_runtime

from .inputs import Batch, make_batches
from .pair import check_pair
from .source import Source, SourceLike, load_source, weights_from_metadata

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["validate", "compare", "TOLERANCES", "FileRunner"]

# int8: a quantised file (``irpe quantize``) against PyTorch fp32; its logits move by a few
# quantisation steps, so the report's agreement figures (top-1, labels, boxes) matter more
# and the int8 verdict is INT8_LIMITS (per-element violations are reported, not judged).
# bf16 (OpenVINO's CPU plugin, 8-bit mantissa): measured worst |error| / (1 + |expected|) 0.034
# (demo DETR logits), 0.018 (DeiT-S iRPE-QKV), 0.004 (demo DeiT); docs/export.md#validation
TOLERANCES = {"fp32": (1e-4, 1e-4), "tf32": (5e-3, 5e-3), "fp16": (5e-2, 5e-2),
              "bf16": (0.1, 0.05), "int8": (0.5, 0.1)}
INT8_LIMITS = {"top1_agreement": (">=", 0.9), "label_agreement": (">=", 0.9),
               "box_l1_max": ("<=", 0.05)}  # boxes: cx, cy, w, h as fractions of the image
Runner = Callable[[Dict[str, torch.Tensor]], Dict[str, np.ndarray]]


class FileRunner:
    """A :data:`Runner` of a file opened on its runtime (irpe.runtime.pick.open_file); with
    ``reference`` (the same file on the ONNX functions, beside the custom-op library) run
    beside it, ``versus`` collects max |file - reference| per output."""

    def __init__(self, file: RuntimeFile, reference: Optional[RuntimeFile] = None) -> None:
        self.file, self.reference = file, reference
        self.versus: Dict[str, float] = {}

    def __call__(self, feeds: Dict[str, torch.Tensor]) -> Dict[str, np.ndarray]:
        np_feeds = {n: feeds[n].numpy() for n in self.file.inputs}
        got = self.file.run(np_feeds)
        if self.reference is not None:
            for name, ref in self.reference.run(np_feeds).items():
                diff = float(np.abs(got[name].astype(np.float64) - ref).max(initial=0.0))
                self.versus[name] = max(self.versus.get(name, 0.0), diff)
        return got


def _open(info: FileInfo, runtime: str, ort_options: OrtOptions, ov_options: OvOptions
          ) -> Tuple[FileRunner, str]:
    """The file's runner on ``runtime`` and its label; on ONNX Runtime with the custom-op
    library, the function path of the same file runs beside it."""
    file = open_file(info.path, runtime, ort=ort_options, ov=ov_options, info=info)
    reference = None
    if getattr(file, "ops", None) is not None and file.ops.custom_ops:  # type: ignore[attr-defined]
        reference = open_file(info.path, runtime, ort=ort_options.with_(custom_ops="off"),
                              info=info, quiet=True)
    return FileRunner(file, reference), file.description


def _reference(src: Source) -> Runner:
    from .onnx import output_module
    module = output_module(src.model, src.spec.task)
    names = ["images"] if src.spec.task == "classification" else ["images", "sizes"]

    @torch.no_grad()
    def run(feeds: Dict[str, torch.Tensor]) -> Dict[str, np.ndarray]:
        out = module(*[feeds[n] for n in names])
        out = out if isinstance(out, tuple) else (out,)
        keys = ["logits"] if src.spec.task == "classification" else ["pred_logits", "pred_boxes"]
        return {k: v.numpy() for k, v in zip(keys, out, strict=True)}

    return run


def compare(got: np.ndarray, expected: np.ndarray, atol: float, rtol: float,
            rows: Optional[Sequence[str]] = None) -> Dict:
    """Error statistics of one output; ``rows`` names the input of each leading index."""
    if got.shape != expected.shape:
        return {"shape_mismatch": [list(got.shape), list(expected.shape)], "violations": 1,
                "worst_ratio": float("inf")}
    got64, exp64 = got.astype(np.float64), expected.astype(np.float64)
    diff = np.abs(got64 - exp64)
    both_nan = np.isnan(got64) & np.isnan(exp64)
    diff = np.where(both_nan, 0.0, np.nan_to_num(diff, nan=np.inf))
    ratio = diff / (atol + rtol * np.abs(np.nan_to_num(exp64)))
    flat = int(np.argmax(ratio)) if ratio.size else 0
    index = np.unravel_index(flat, ratio.shape) if ratio.size else ()
    denom = np.linalg.norm(got64) * np.linalg.norm(exp64)
    return {
        "max_abs": float(diff.max(initial=0.0)),
        "mean_abs": float(diff.mean()) if diff.size else 0.0,
        "max_rel": float((diff / np.maximum(np.abs(exp64), 1e-12)).max(initial=0.0)),
        "cosine": float(np.nansum(got64 * exp64) / denom) if denom > 0 else 1.0,
        "violations": int((ratio > 1).sum()), "elements": int(diff.size),
        "worst_ratio": float(ratio.max(initial=0.0)),
        "worst": {"input": rows[int(index[0])] if rows is not None and index else None,
                  "index": [int(i) for i in index],
                  "got": float(got64[index]) if ratio.size else None,
                  "expected": float(exp64[index]) if ratio.size else None},
    }


def _topk_metrics(got: np.ndarray, expected: np.ndarray) -> Dict:
    k = min(5, got.shape[-1])
    top_got = np.argsort(-got, axis=-1)[:, :k]
    top_exp = np.argsort(-expected, axis=-1)[:, :k]
    overlap = [len(set(a) & set(b)) / k for a, b in zip(top_got, top_exp, strict=True)]
    return {"top1_agreement": float(np.mean(top_got[:, 0] == top_exp[:, 0])),
            f"top{k}_agreement": float(np.mean(overlap))}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _detection_metrics(got: Dict[str, np.ndarray], exp: Dict[str, np.ndarray]) -> Dict:
    pg, pe = _softmax(got["pred_logits"])[..., :-1], _softmax(exp["pred_logits"])[..., :-1]
    box_l1 = np.abs(got["pred_boxes"] - exp["pred_boxes"]).mean(axis=-1)
    return {"label_agreement": float(np.mean(pg.argmax(-1) == pe.argmax(-1))),
            "score_max_abs": float(np.abs(pg.max(-1) - pe.max(-1)).max()),
            "box_l1_mean": float(box_l1.mean()), "box_l1_max": float(box_l1.max())}


def _resolve(path: str, props: Dict[str, str], source: Optional[SourceLike],
             checkpoint: Optional[str], runtime: str, ort_options: OrtOptions,
             ov_options: OvOptions) -> Tuple[Runner, Source, str]:
    """The file's runner on ``runtime``, the PyTorch reference (from the file's metadata
    ``props`` unless given) and a label."""
    if source is not None:
        src = load_source(source, checkpoint)
        check_pair(path, props, src, os.fspath(source)
                   if isinstance(source, (str, os.PathLike)) else type(source).__name__)
        spec = src.spec
    else:
        if "irpe.weights" not in props:
            raise InvalidInput(f"{path} does not say which weights it was exported from; "
                               "pass the source model (and checkpoint)")
        spec = spec_from_metadata(props)
        src = (load_source(spec.model_name, checkpoint, spec) if checkpoint is not None
               else weights_from_metadata(props["irpe.weights"], spec))
    info = FileInfo(path, file_kind(path), props, spec, onnx_precision(props))
    run, label = _open(info, runtime, ort_options, ov_options)
    return run, src, label


def _check_precision(precision: str, runtime: str) -> None:
    """bf16 is OpenVINO's (it compiles in bf16); OpenVINO runs fp32, bf16 or an int8 file."""
    if precision not in TOLERANCES:
        raise InvalidInput(f"precision must be one of {sorted(TOLERANCES)}, got {precision!r}")
    if precision == "bf16" and runtime != "openvino":
        raise InvalidInput(f"precision bf16 needs --runtime openvino ({runtime} runs the file in "
                         "the precision it was built or exported in)")
    if runtime == "openvino" and precision not in ("fp32", "bf16", "int8"):
        raise InvalidInput(f"precision {precision}: openvino runs fp32 or bf16 (int8: a "
                         "quantised file)")


def _run_all(batches: List[Batch], run: Runner, ref: Runner
             ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray], List[str]]:
    got: Dict[str, List[np.ndarray]] = {}
    exp: Dict[str, List[np.ndarray]] = {}
    rows: List[str] = []
    for batch in batches:
        g, e = run(batch.feeds), ref(batch.feeds)
        for name in e:
            got.setdefault(name, []).append(g[name])
            exp.setdefault(name, []).append(e[name])
        rows += batch.names
    cat = lambda d: {k: np.concatenate(v) for k, v in d.items()}  # noqa: E731
    return cat(got), cat(exp), rows


def validate(onnx_or_engine_path: StrPath, source: Optional[SourceLike] = None,
             checkpoint: Optional[str] = None,
             num_inputs: int = 8, image_dir: Optional[StrPath] = None,
             atol: Optional[float] = None, rtol: Optional[float] = None,
             precision: Optional[str] = None,
             sizes: Optional[Sequence[Tuple[int, int]]] = None,
             custom_ops: Optional[str] = None,
             ort_options: Optional[OrtOptions] = None, runtime: Optional[str] = None,
             ov_options: Optional[OvOptions] = None) -> Dict:
    """Run the file and PyTorch on the same inputs; the report's ``passed`` is the verdict.
    ``runtime``: onnxruntime, openvino or tensorrt (default: the one that serves the file,
    :func:`irpe.runtime.pick.pick_runtime`).
    ``ort_options``: how ONNX Runtime runs the iRPE nodes (default ``OrtOptions()``;
    irpe.runtime.onnxruntime.session), ``custom_ops`` (auto/on/off) replacing its mode;
    ``ov_options``: OpenVINO's threads, streams and hint (irpe.runtime.openvino.session), its
    precision replaced by ``precision`` (bf16 compiles in bf16, anything else in fp32);
    ``precision`` picks the tolerances (default: the file's, from its metadata: int8 when
    quantised)."""
    ort_options = (ort_options or OrtOptions()).with_(custom_ops=custom_ops)
    path = os.fspath(onnx_or_engine_path)
    runtime = pick_runtime(path, "cpu", runtime)
    if runtime == "tensorrt":
        from irpe.runtime.tensorrt.runner import require_gpu
        require_gpu()  # before the sidecar and the reference: nothing runs an engine here
    if runtime == "torch":
        raise InvalidInput(f"{path} is not an exported file (.onnx, OpenVINO .xml or a TensorRT "
                           "engine): validate compares an exported file with its model")
    if custom_ops is not None and runtime != "onnxruntime":
        raise InvalidInput(f"custom_ops is ONNX Runtime's option, but {path} runs on {runtime}: "
                           "pass runtime='onnxruntime'")
    props = _file_props(path, source is not None)  # read once: an ONNX file's whole protobuf
    if precision is None:  # the file's: int8 when quantised (an engine: its build's, fp32)
        precision = "fp32" if file_kind(path) == "engine" else onnx_precision(props)
    _check_precision(precision, runtime)
    ov_options = (ov_options or OvOptions()).with_(
        precision="bf16" if precision == "bf16" else "fp32")
    if not os.path.isfile(path):
        raise MissingFile(f"file not found: {path}")
    atol = TOLERANCES[precision][0] if atol is None else atol
    rtol = TOLERANCES[precision][1] if rtol is None else rtol
    start = time.perf_counter()
    run, src, label = _resolve(path, props, source, checkpoint, runtime, ort_options,
                               ov_options)
    if sizes and src.spec.task != "detection":
        raise InvalidInput("sizes apply to detection models only")
    img = getattr(getattr(src.model, "patch_embed", None), "img_size", None)
    batches = make_batches(src.spec, num_inputs, image_dir, sizes, img)
    got, exp, rows = _run_all(batches, run, _reference(src))
    outputs = {k: compare(got[k], exp[k], atol, rtol, rows) for k in exp}
    metrics = (_topk_metrics(got["logits"], exp["logits"]) if src.spec.task == "classification"
               else _detection_metrics(got, exp))
    failed = sorted((k for k, v in outputs.items() if v["violations"]),
                    key=lambda k: -outputs[k]["worst_ratio"])
    missed = _missed_limits(metrics) if precision == "int8" else []
    if precision == "int8":  # judged on agreement; element errors stay in the report
        failed = [k for k in failed if "shape_mismatch" in outputs[k]]
    return {"file": path, "runtime": label, "model": src.spec.model_name,
            "task": src.spec.task, "weights": src.weights, "precision": precision,
            "atol": atol, "rtol": rtol, "num_inputs": num_inputs,
            "batches": [b.label for b in batches], "outputs": outputs, "metrics": metrics,
            "passed": not failed and not missed, "failed_outputs": failed,
            "failed_metrics": missed,
            "custom_ops_vs_functions": getattr(run, "versus", None) or None,
            "seconds": round(time.perf_counter() - start, 2)}


def _missed_limits(metrics: Dict) -> List[str]:
    """The INT8_LIMITS a quantised file's metrics miss, as "name value op limit" lines."""
    out = []
    for name, (op, limit) in INT8_LIMITS.items():
        value = metrics.get(name)
        if value is not None and not (value >= limit if op == ">=" else value <= limit):
            out.append(f"{name} {value:.4g} (limit {op} {limit:g})")
    return out


def _file_props(path: str, has_source: bool) -> Dict[str, str]:
    """The file's metadata (irpe.artifact.files.read_props), read once for the whole
    validation; {} for a missing file (refused after the usage checks) and for an engine
    without its sidecar when the source model is given (it describes the model)."""
    if not os.path.isfile(path):
        return {}
    if has_source and file_kind(path) == "engine" and not sidecar_path(path).is_file():
        return {}
    return read_props(path)


def write_report(report: Dict, path: StrPath) -> Path:
    """Write the report as indented JSON, atomically (irpe.atomic)."""
    return write_text(path, json.dumps(report, indent=2) + "\n")
