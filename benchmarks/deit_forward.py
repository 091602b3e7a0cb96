"""Forward time of DeiT-S plain vs iRPE-K vs iRPE-QKV on CPU, measured side by side.

    python -m benchmarks.deit_forward [--batch 8] [--threads 2] [--repeats 7] [--quick]
                                      [--unfused] [--sdpa] [--detr-memory]

Models are built with random weights (iRPE tables non-zero), run under inference_mode, warmed
up, then timed round-robin (one forward of each model per round) so drift on a shared machine
hits all models alike. Reports median / p90 per forward and the throughput ratios to the plain
model (goals: iRPE-K >= 0.95, iRPE-QKV >= 0.90); ``--unfused`` adds the iRPE models on the
unfused path (IRPE_FUSED_ATTENTION=0) as extra rows, ``--sdpa`` on the SDPA-based path (the
native kernel, irpe.fused.cpu_library, set aside), ``--detr-memory`` the DETR-R50 peak
memory (benchmarks.detr_memory). The header says whether the native kernel was loaded. Writes
JSON + Markdown under benchmarks/results/<device>/.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch

from benchmarks.common import device_name
from benchmarks.detr_memory import measure_peaks, report_lines
from benchmarks.report import write_json_md
from irpe import create_model, randomize_tables
from irpe.fused import set_fused_attention
from irpe.fused.cpu_library import cpu_library, set_cpu_library

MODELS = {
    "plain": "deit_small_patch16_224",
    "irpe_k": "deit_small_patch16_224_ctx_product_50_shared_k",
    "irpe_qkv": "deit_small_patch16_224_ctx_product_50_shared_qkv",
}
QUICK_MODELS = {k: v.replace("small", "tiny") for k, v in MODELS.items() if k != "irpe_qkv"}
GOALS = {"irpe_k": 0.95, "irpe_qkv": 0.90}  # throughput / plain, eager CPU path (issue 31)
PATHS = ("_unfused", "_sdpa")  # row suffixes: the same model on the unfused / SDPA path


def _build(name: str) -> torch.nn.Module:
    return randomize_tables(create_model(name).eval())


def with_paths(models: Dict[str, str], suffixes) -> Dict[str, str]:
    """The models plus each iRPE model again as ``<key><suffix>`` for each path suffix."""
    extra = {key + suffix: name for suffix in suffixes for key, name in models.items()
             if key != "plain"}
    return dict(models, **extra)


def _path(key: str) -> str:
    return next((s for s in PATHS if key.endswith(s)), "")


def _forward(model: torch.nn.Module, x: torch.Tensor, path: str) -> None:
    """One forward on ``path``: "" (the default dispatch), "_unfused" or "_sdpa"."""
    set_fused_attention("unfused" if path == "_unfused" else None)
    set_cpu_library(None if path == "_sdpa" else True)
    try:
        model(x)
    finally:
        set_fused_attention(None)
        set_cpu_library(True)


def measure(models: Dict[str, str], batch: int, repeats: int,
            warmup: int) -> Dict[str, List[float]]:
    """Seconds per forward for each model, interleaved round-robin (``*_unfused`` / ``*_sdpa``
    keys run on that path, sharing the weights of their model)."""
    built: Dict[str, torch.nn.Module] = {}
    for key, name in models.items():
        base = key[:-len(_path(key))] if _path(key) else None
        built[key] = built[base] if base in built else _build(name)
    x = torch.randn(batch, 3, 224, 224)
    times: Dict[str, List[float]] = {key: [] for key in built}
    with torch.inference_mode():
        for round_ in range(warmup + repeats):
            for key, model in built.items():
                start = time.perf_counter()
                _forward(model, x, _path(key))
                if round_ >= warmup:
                    times[key].append(time.perf_counter() - start)
            print(f"  round {round_ + 1}/{warmup + repeats}"
                  f"{' (warm-up)' if round_ < warmup else ''}", flush=True)
    return times


def summarize(times: Dict[str, List[float]], models: Dict[str, str], batch: int) -> Dict:
    rows = {}
    base = statistics.median(times["plain"])
    for key, ts in times.items():
        med = statistics.median(ts)
        p90 = sorted(ts)[min(len(ts) - 1, int(round(0.9 * (len(ts) - 1))))]
        goal = GOALS.get(key)
        rows[key] = {"model": models[key], "median_ms": med * 1e3, "p90_ms": p90 * 1e3,
                     "images_per_s": batch / med, "ratio_to_plain": med / base,
                     "throughput_ratio": base / med, "goal": goal,
                     "meets_goal": None if goal is None else base / med >= goal,
                     "samples_ms": [t * 1e3 for t in ts]}
    return rows


def write_report(result: Dict, out_dir: Path) -> Path:
    lines = [f"# DeiT forward on {result['device']}", "",
             f"batch {result['batch']}, {result['threads']} threads, torch {result['torch']}, "
             f"{result['repeats']} timed rounds (median).", "",
             f"load before / after: {result['load'][0]:.2f} / {result['load'][1]:.2f} "
             "(1-min average).", "",
             f"iRPE attention kernel: {result.get('cpu_kernel') or 'not built (SDPA path)'}.", "",
             "| variant | model | median ms | p90 ms | img/s | img/s / plain | goal |",
             "|---|---|---|---|---|---|---|"]
    for key, row in result["results"].items():
        goal = "" if row["goal"] is None else (f">= {row['goal']:.2f} "
                                               f"{'met' if row['meets_goal'] else 'NOT met'}")
        lines.append(f"| {key} | {row['model']} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} | "
                     f"{row['images_per_s']:.1f} | {row['throughput_ratio']:.3f} | {goal} |")
    if result.get("detr_memory"):
        lines += [""] + report_lines(result["detr_memory"])
    return write_json_md(out_dir, "deit_forward", result, lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="DeiT-Ti, batch 1, 1 round: checks the report, not the numbers")
    parser.add_argument("--unfused", action="store_true",
                        help="also time the iRPE models on the unfused path (extra rows)")
    parser.add_argument("--sdpa", action="store_true",
                        help="also time the iRPE models on the SDPA path (no native kernel)")
    parser.add_argument("--detr-memory", action="store_true",
                        help="also measure DETR-R50 peak memory, plain vs iRPE-K (800x1216 bs 1)")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.repeats, args.warmup = 1, 1, 1
    models = QUICK_MODELS if args.quick else MODELS
    chosen = zip(PATHS, (args.unfused, args.sdpa), strict=True)
    models = with_paths(models, [s for s, on in chosen if on])
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"DeiT forward benchmark: batch {args.batch}, {args.threads} threads, "
          f"{args.repeats} rounds", flush=True)
    load = [os.getloadavg()[0]]
    times = measure(models, args.batch, args.repeats, args.warmup)
    load.append(os.getloadavg()[0])
    result = {"device": device_name(), "torch": torch.__version__, "batch": args.batch,
              "threads": args.threads, "repeats": args.repeats, "quick": args.quick,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": load,
              "cpu_kernel": str(lib.path) if (lib := cpu_library()) else None,
              "results": summarize(times, models, args.batch)}
    if args.detr_memory:
        result["detr_memory"] = measure_peaks(quick=args.quick)
    out_dir = args.out or Path(__file__).parent / "results" / result["device"]
    path = write_report(result, out_dir)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
