"""Forward time of DeiT-S plain vs iRPE-K vs iRPE-QKV on CPU, measured side by side.

    python -m benchmarks.deit_forward [--batch 8] [--threads 2] [--repeats 7] [--quick]

Models are built with random weights (iRPE tables non-zero), run under inference_mode, warmed
up, then timed round-robin (one forward of each model per round) so drift on a shared machine
hits all models alike. Reports median / p90 per forward and the ratios to the plain model;
writes JSON + Markdown under benchmarks/results/<device>/.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch

from benchmarks.report import write_json_md
from irpe import create_model, randomize_tables

MODELS = {
    "plain": "deit_small_patch16_224",
    "irpe_k": "deit_small_patch16_224_ctx_product_50_shared_k",
    "irpe_qkv": "deit_small_patch16_224_ctx_product_50_shared_qkv",
}
QUICK_MODELS = {k: v.replace("small", "tiny") for k, v in MODELS.items() if k != "irpe_qkv"}


def device_name() -> str:
    """A filesystem-safe CPU name, e.g. cpu-2c-amd-epyc-9b14."""
    model = platform.processor() or "cpu"
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = re.search(r"model name\s*:\s*(.+)", text).group(1)
    except (OSError, AttributeError):
        pass
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return f"cpu-{os.cpu_count()}c-{slug}"[:60]


def _build(name: str) -> torch.nn.Module:
    return randomize_tables(create_model(name).eval())


def measure(models: Dict[str, str], batch: int, repeats: int, warmup: int) -> Dict[str, List[float]]:
    """Seconds per forward for each model, interleaved round-robin."""
    built = {key: _build(name) for key, name in models.items()}
    x = torch.randn(batch, 3, 224, 224)
    times: Dict[str, List[float]] = {key: [] for key in built}
    with torch.inference_mode():
        for round_ in range(warmup + repeats):
            for key, model in built.items():
                start = time.perf_counter()
                model(x)
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
        rows[key] = {"model": models[key], "median_ms": med * 1e3, "p90_ms": p90 * 1e3,
                     "images_per_s": batch / med, "ratio_to_plain": med / base,
                     "samples_ms": [t * 1e3 for t in ts]}
    return rows


def write_report(result: Dict, out_dir: Path) -> Path:
    lines = [f"# DeiT forward on {result['device']}", "",
             f"batch {result['batch']}, {result['threads']} threads, torch {result['torch']}, "
             f"{result['repeats']} timed rounds (median).", "",
             "| variant | model | median ms | p90 ms | img/s | x plain |", "|---|---|---|---|---|---|"]
    for key, row in result["results"].items():
        lines.append(f"| {key} | {row['model']} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} | "
                     f"{row['images_per_s']:.1f} | {row['ratio_to_plain']:.3f} |")
    return write_json_md(out_dir, "deit_forward", result, lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="DeiT-Ti, batch 1, 1 round: checks the report, not the numbers")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.repeats, args.warmup = 1, 1, 1
    models = QUICK_MODELS if args.quick else MODELS
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"DeiT forward benchmark: batch {args.batch}, {args.threads} threads, "
          f"{args.repeats} rounds", flush=True)
    times = measure(models, args.batch, args.repeats, args.warmup)
    result = {"device": device_name(), "torch": torch.__version__, "batch": args.batch,
              "threads": args.threads, "repeats": args.repeats, "quick": args.quick,
              "date": time.strftime("%Y-%m-%d"), "results": summarize(times, models, args.batch)}
    out_dir = args.out or Path(__file__).parent / "results" / result["device"]
    path = write_report(result, out_dir)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
