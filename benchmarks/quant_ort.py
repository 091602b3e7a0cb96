"""ONNX Runtime throughput of int8 DeiT-S files (``irpe quantize``) beside their fp32 exports.

    python -m benchmarks.quant_ort [--batch 8] [--threads 2] [--repeats 7] [--sessions 2]
                                   [--mode static|dynamic] [--activations int8|uint8]
                                   [--samples 16] [--quick]

Plain DeiT-S, iRPE-K and iRPE-QKV are exported (random weights, non-zero iRPE tables, as in
benchmarks.export_ort) and quantised with export.quantize (static: QDQ calibrated on the shapes
set through the model's preprocessing). Every fp32 and int8 file runs on stock ONNX Runtime and,
where the custom-op library is built, with it (rows ``*_ops``), all timed round-robin in the
same rounds on one shared thread pool (see benchmarks.export_ort). Reports img/s, the ratio to
plain fp32 on stock ONNX Runtime and to plain int8 of the same kind of session, against the
goals (issue 32), the int8-vs-fp32 logit agreement of each model, and the fusion counts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from benchmarks import deit_forward
from benchmarks.common import device_name
from benchmarks.deit_forward import MODELS
from benchmarks.export_ort import (
    OPS_SUFFIX,
    QUICK_OVERRIDES,
    export_models,
    round_robin,
    session_runs,
)
from benchmarks.report import write_json_md
from irpe.runtime.onnxruntime.session import OrtOptions, find_library, share_thread_pool

INT8 = "_int8"
# (row, reference row, goal): throughput(row) / throughput(reference) >= goal
GOALS = [("irpe_k_int8_ops", "plain", 2.5), ("irpe_k_int8_ops", "plain_int8_ops", 0.95),
         ("irpe_qkv_int8_ops", "plain_int8_ops", 0.90)]


def quantize_models(paths: Dict[str, Path], mode: str, samples: int,
                    activations: str = "int8") -> Dict[str, Path]:
    """Each fp32 file quantised (key + INT8) beside it by ``irpe quantize`` in a child process
    (calibration makes sessions with pools of their own, which this process's shared pool
    forbids once made)."""
    out = {}
    for key, path in paths.items():
        start = time.perf_counter()
        target = path.with_name(f"{key}{INT8}.onnx")
        calibration = ["--calibration", "shapes", "--samples", str(samples),
                       "--activations", activations] if mode == "static" else []
        subprocess.run([sys.executable, "-m", "irpe", "quantize", str(path), "-o", str(target),
                        "--mode", mode] + calibration, check=True, stdout=subprocess.DEVNULL)
        out[key + INT8] = target
        print(f"  quantised {key:<9} ({mode}) in {time.perf_counter() - start:.1f} s", flush=True)
    return out


def measure(paths: Dict[str, Path], batch: int, threads: int, repeats: int, warmup: int,
            library: Optional[Path], sessions: int):
    """(seconds per run per row, fusion line per row, logits per row) for every file, stock
    and with the custom-op ``library`` (when not None), timed round-robin."""
    runs, logits, how = session_runs(paths, batch, threads, library, sessions)
    fusion = {label: report.describe() for label, report in how.items()}
    return round_robin(runs, repeats, warmup, "models"), fusion, logits


def agreement(logits: Dict[str, np.ndarray]) -> Dict[str, Dict]:
    """Per int8 row: max |int8 - fp32| logit and top-1 agreement with its fp32 row (same path)."""
    out = {}
    for key, got in logits.items():
        if INT8 not in key:
            continue
        ref = logits[key.replace(INT8, "")]
        out[key] = {"max_abs": float(np.abs(got - ref).max()),
                    "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean())}
    return out


def summarize(times: Dict[str, List[float]], models: Dict[str, str], batch: int) -> Dict:
    """deit_forward's rows plus throughput / plain fp32 stock and / plain int8 (same path)."""
    rows = deit_forward.summarize(times, models, batch)
    for key, row in rows.items():
        row.pop("ratio_to_plain")
        plain8 = "plain" + INT8 + (OPS_SUFFIX if key.endswith(OPS_SUFFIX) else "")
        row["x_plain_fp32"] = statistics.median(times["plain"]) / statistics.median(times[key])
        row["x_plain_int8"] = (statistics.median(times[plain8]) / statistics.median(times[key])
                               if plain8 in times else None)
        row["x_plain_fp32_per_round"] = statistics.median(
            p / t for p, t in zip(times["plain"], times[key], strict=True))
    return rows


def goals(times: Dict[str, List[float]]) -> List[Dict]:
    """Each goal of :data:`GOALS` judged on the median times (skipped rows absent)."""
    out = []
    for row, ref, goal in GOALS:
        if row in times and ref in times:
            ratio = statistics.median(times[ref]) / statistics.median(times[row])
            rounds = statistics.median(r / t for r, t in zip(times[ref], times[row], strict=True))
            out.append({"row": row, "reference": ref, "goal": goal, "ratio": ratio,
                        "ratio_round_median": rounds, "met": ratio >= goal})
    return out


def write_report(result: Dict, out_dir: Path) -> Path:
    """quant_ort.json + .md in ``out_dir`` (quant_ort_dynamic.* for --mode dynamic,
    quant_ort_uint8.* for uint8 activations)."""
    lines = [f"# ONNX Runtime, int8 vs fp32 exported DeiT, on {result['device']}", "",
             f"batch {result['batch']}, {result['threads']} threads, onnxruntime "
             f"{result['onnxruntime']}, int8 {result['mode']} "
             f"(activations {result.get('activations', 'int8')})"
             f"{_calibration(result)}, {result['repeats']} timed rounds (median) of "
             f"{result['sessions']} "
             f"session(s) per row, shared thread pool, load average {result['load_before']} -> "
             f"{result['load_after']} (uptime before: {result['uptime']}; after: "
             f"{result.get('uptime_after')}).", "",
             "| row | median ms | p90 ms | img/s | x plain fp32 stock | per round | "
             "x plain int8 (same path) | iRPE path |", "|---|---|---|---|---|---|---|---|"]
    for key, row in result["results"].items():
        x8 = row["x_plain_int8"]
        lines.append(f"| {key} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} | "
                     f"{row['images_per_s']:.1f} | {row['x_plain_fp32']:.2f} | "
                     f"{row['x_plain_fp32_per_round']:.2f} | "
                     f"{'' if x8 is None else f'{x8:.2f}'} | {result['fusion'][key]} |")
    lines += ["", "| goal | ratio (medians) | per-round median | verdict |", "|---|---|---|---|"]
    for g in result["goals"]:
        lines.append(f"| {g['row']} / {g['reference']} >= {g['goal']:.2f} | {g['ratio']:.3f} | "
                     f"{g['ratio_round_median']:.3f} | {'met' if g['met'] else 'missed'} |")
    lines += ["", "| int8 row | max abs logit diff vs fp32 | top-1 agreement (random weights, "
              "random inputs) |", "|---|---|---|"]
    for key, a in result["agreement"].items():
        lines.append(f"| {key} | {a['max_abs']:.3g} | {a['top1_agreement']:.3f} |")
    stem = "quant_ort" if result["mode"] == "static" else f"quant_ort_{result['mode']}"
    stem += "_uint8" if result.get("activations") == "uint8" else ""
    return write_json_md(out_dir, stem, result, lines)


def _calibration(result: Dict) -> str:
    return f" ({result['samples']} calibration images)" if result["mode"] == "static" else ""


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "uptime unavailable"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option, default in (("batch", 8), ("threads", 2), ("repeats", 7), ("warmup", 2),
                            ("sessions", 2), ("samples", 16)):
        parser.add_argument(f"--{option}", type=int, default=default)
    parser.add_argument("--mode", choices=["static", "dynamic"], default="static")
    parser.add_argument("--activations", choices=["int8", "uint8"], default="int8",
                        help="static: irpe quantize --activations")
    parser.add_argument("--quick", action="store_true",
                        help="2-block DeiT-Ti, batch 1, 1 round: checks the report only")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    args = parser.parse_args(argv)
    if min(args.batch, args.threads, args.repeats, args.sessions, args.samples) < 1 \
            or args.warmup < 0:
        parser.error("--batch, --threads, --repeats, --sessions, --samples must be >= 1")
    models, overrides = dict(MODELS), {}
    if args.quick:
        args.batch, args.repeats, args.warmup, args.sessions, args.samples = 1, 1, 1, 1, 2
        models = {k: v.replace("small", "tiny") for k, v in MODELS.items() if k != "irpe_qkv"}
        overrides = QUICK_OVERRIDES
    import onnxruntime
    torch.set_num_threads(args.threads)
    share_thread_pool(args.threads)
    library = find_library(OrtOptions.from_env().library)
    print(f"int8 benchmark: batch {args.batch}, {args.threads} threads, custom-op rows: "
          f"{library or 'none (plugins/onnxruntime/build.sh)'}", flush=True)
    uptime, load_before = _uptime(), _load()
    with tempfile.TemporaryDirectory() as tmp:
        paths = export_models(models, Path(tmp), overrides)
        paths.update(quantize_models(dict(paths), args.mode, args.samples, args.activations))
        times, fusion, logits = measure(paths, args.batch, args.threads, args.repeats,
                                        args.warmup, library, args.sessions)
    names = {k: models[k.replace(INT8, "").replace(OPS_SUFFIX, "")] for k in times}
    result = {"device": device_name(), "onnxruntime": onnxruntime.__version__,
              "torch": torch.__version__, "batch": args.batch, "threads": args.threads,
              "repeats": args.repeats, "sessions": args.sessions, "mode": args.mode,
              "activations": args.activations if args.mode == "static" else "uint8 dynamic",
              "samples": args.samples, "quick": args.quick, "date": time.strftime("%Y-%m-%d"),
              "custom_op_library": str(library) if library else None, "uptime": uptime,
              "load_before": load_before, "load_after": _load(), "uptime_after": _uptime(),
              "fusion": fusion,
              "results": summarize(times, names, args.batch), "goals": goals(times),
              "agreement": agreement(logits)}
    out_dir = args.out or Path(__file__).parent / "results" / result["device"]
    print(write_report(result, out_dir).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
