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

from irpe.artifact.contract import (
    ENGINE_SUFFIXES,
    onnx_precision,
    read_onnx_props,
    read_sidecar,
    sidecar_path,
)
from irpe.artifact.openvino_ir import is_ir, read_ir_props
from irpe.artifact.trained import spec_from_metadata
from irpe.atomic import write_text
from irpe.errors import InvalidInput, MissingFile
from irpe.runtime.onnxruntime.session import OrtOptions
from irpe.runtime.openvino.session import OvOptions

from .inputs import Batch, make_batches
from .pair import check_pair
from .source import Source, SourceLike, load_source, weights_from_metadata

if TYPE_CHECKING:
    from _typeshed import StrPath
    from onnxruntime import InferenceSession

__all__ = ["validate", "compare", "TOLERANCES", "ENGINE_SUFFIXES", "RUNTIMES", "file_runtime"]

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
RUNTIMES = ("onnxruntime", "openvino", "tensorrt")


def _onnx_runner(path: str, ort_options: Optional[OrtOptions] = None
                 ) -> Tuple[Runner, Dict[str, str], str]:
    """ORT session run as ``ort_options`` say (custom-op library when found, see
    irpe.runtime.onnxruntime.session); with the library, a function-path session runs beside it
    and ``run.versus`` collects max |custom - functions|."""
    import onnxruntime as ort

    from irpe.runtime.onnxruntime.session import create_session
    props = read_onnx_props(path)
    session, ops = create_session(path, options=ort_options)
    functions = (create_session(path, options=ort_options, custom_ops="off", quiet=True)[0]
                 if ops.custom_ops else None)
    run = _OrtRun(session, functions)
    return run, props, f"onnxruntime {ort.__version__} (CPUExecutionProvider; {ops.describe()})"


class _OrtRun:
    """A :data:`Runner` of an ORT session; with ``functions`` (the function-path session of the
    same file) run beside it, ``versus`` collects max |session - functions| per output."""

    def __init__(self, session: InferenceSession, functions: Optional[InferenceSession]
                 ) -> None:
        self.session, self.functions = session, functions
        self.names = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]
        self.versus: Dict[str, float] = {}

    def __call__(self, feeds: Dict[str, torch.Tensor]) -> Dict[str, np.ndarray]:
        np_feeds = {n: feeds[n].numpy() for n in self.names}
        got = dict(zip(self.outputs, self.session.run(None, np_feeds), strict=True))
        if self.functions is not None:
            for name, ref in zip(self.outputs, self.functions.run(None, np_feeds), strict=True):
                diff = float(np.abs(got[name].astype(np.float64) - ref).max(initial=0.0))
                self.versus[name] = max(self.versus.get(name, 0.0), diff)
        return got


def _openvino_runner(path: str, ov_options: OvOptions) -> Tuple[Runner, Dict[str, str], str]:
    """The file (.onnx or IR) compiled by OpenVINO's CPU plugin as ``ov_options`` say."""
    from irpe.runtime.openvino.session import compile_model
    props = read_ir_props(path) if is_ir(path) else read_onnx_props(Path(path))
    compiled, line = compile_model(path, ov_options)
    request = compiled.create_infer_request()
    names = [i.get_any_name() for i in compiled.inputs]

    def run(feeds: Dict[str, torch.Tensor]) -> Dict[str, np.ndarray]:
        out = request.infer({n: feeds[n].numpy() for n in names}, share_outputs=False)
        return {o.get_any_name(): out[o] for o in compiled.outputs}

    return run, props, line


def _engine_runner(path: str) -> Tuple[Runner, Dict[str, str], str]:
    from irpe.runtime.tensorrt.runner import TRTRunner
    props = read_sidecar(path).get("onnx_metadata", {}) if sidecar_path(path).is_file() else {}
    runner = TRTRunner(path)

    def run(feeds: Dict[str, torch.Tensor]) -> Dict[str, np.ndarray]:
        out = runner(**feeds)
        torch.cuda.current_stream(runner.device).synchronize()
        return {k: v.float().cpu().numpy() for k, v in out.items()}

    return run, props, f"{runner.trt.__name__} {runner.trt.__version__}"


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


def _resolve(path: str, source: Optional[SourceLike], checkpoint: Optional[str], runtime: str,
             ort_options: OrtOptions, ov_options: OvOptions) -> Tuple[Runner, Source, str]:
    """The file's runner on ``runtime``, the PyTorch reference (from metadata unless given)
    and a label."""
    if runtime == "tensorrt":
        run, props, label = _engine_runner(path)
    elif runtime == "openvino":
        run, props, label = _openvino_runner(path, ov_options)
    else:
        run, props, label = _onnx_runner(path, ort_options)
    if source is not None:
        src = load_source(source, checkpoint)
        check_pair(path, props, src, os.fspath(source) if isinstance(source, (str, os.PathLike))
                   else type(source).__name__)  # usage error before any run
        return run, src, label
    if "irpe.weights" not in props:
        raise InvalidInput(f"{path} does not say which weights it was exported from; "
                           "pass the source model (and checkpoint)")
    spec = spec_from_metadata(props)
    if checkpoint is not None:
        return run, load_source(spec.model_name, checkpoint, spec), label
    return run, weights_from_metadata(props["irpe.weights"], spec), label


def file_runtime(path: str, runtime: Optional[str] = None) -> str:
    """The runtime that runs ``path``: ``runtime`` when given (checked against the file's kind),
    else tensorrt for an engine, openvino for an IR (.xml), onnxruntime for ONNX."""
    kind = ("tensorrt" if path.endswith(ENGINE_SUFFIXES) else "openvino" if is_ir(path)
            else None)
    if runtime is not None and runtime not in RUNTIMES:
        raise InvalidInput(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if kind is not None and runtime not in (None, kind):
        raise InvalidInput(f"{path} runs on {kind}, not on {runtime}")
    if kind is None and runtime == "tensorrt":
        raise InvalidInput(f"{path}: tensorrt runs an engine; build one with irpe build-engine")
    return kind or runtime or "onnxruntime"


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
    ``runtime``: onnxruntime, openvino or tensorrt (default by the file: :func:`file_runtime`).
    ``ort_options``: how ONNX Runtime runs the iRPE nodes (default ``OrtOptions()``;
    irpe.runtime.onnxruntime.session), ``custom_ops`` (auto/on/off) replacing its mode;
    ``ov_options``: OpenVINO's threads, streams and hint (irpe.runtime.openvino.session), its
    precision replaced by ``precision`` (bf16 compiles in bf16, anything else in fp32);
    ``precision`` picks the tolerances (default: the file's, from its metadata: int8 when
    quantised)."""
    ort_options = (ort_options or OrtOptions()).with_(custom_ops=custom_ops)
    path = os.fspath(onnx_or_engine_path)
    runtime = file_runtime(path, runtime)
    if precision is None:
        precision = _file_precision(path)
    _check_precision(precision, runtime)
    ov_options = (ov_options or OvOptions()).with_(
        precision="bf16" if precision == "bf16" else "fp32")
    if not os.path.isfile(path):
        raise MissingFile(f"file not found: {path}")
    atol = TOLERANCES[precision][0] if atol is None else atol
    rtol = TOLERANCES[precision][1] if rtol is None else rtol
    start = time.perf_counter()
    run, src, label = _resolve(path, source, checkpoint, runtime, ort_options, ov_options)
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


def _file_precision(path: str) -> str:
    """int8 for a quantised ONNX file or IR (irpe.artifact.contract), else fp32."""
    if path.endswith(ENGINE_SUFFIXES) or not os.path.isfile(path):
        return "fp32"
    return onnx_precision(read_ir_props(path) if is_ir(path) else read_onnx_props(Path(path)))


def write_report(report: Dict, path: StrPath) -> Path:
    """Write the report as indented JSON, atomically (irpe.atomic)."""
    return write_text(path, json.dumps(report, indent=2) + "\n")
