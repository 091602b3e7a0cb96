"""CPU cost of the iRPE ops vs the official (naive) formulations, and how it grows with L.

    python -m benchmarks.ops_cpu [--threads 1] [--repeats 7] [--quick] [--out DIR]

Per sequence length L = 1 + H*W (DeiT-S shapes: batch 1, 6 heads, product ratio 1.9 -> 50
buckets, head dim 64, shared tables):
  K path: irpe::rpe_gather (torch.gather with a broadcast index) vs the official lookup of the
          flattened table with a flattened (Lq*Lk) index;
  V path: irpe::rpe_scatter + (B,H,L,K) @ W vs the official O(L^2 D) path that gathers W into
          (L, L, D) and contracts it with the attention (only up to L = 785: memory).
Reports median ms, the official/irpe ratio and the local growth exponent p (t ~ L^p).
Writes ops_cpu.{json,md} under benchmarks/results/<device>/.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict

import torch

from benchmarks.common import device_name
from benchmarks.fits import growth
from benchmarks.ops_common import (
    env_info,
    fmt,
    grid_ids,
    median_ms,
    official_flat_index,
    official_gather,
    time_round_robin,
    write_report,
)
from irpe.bucket import num_buckets
from irpe.ops import rpe_gather, rpe_scatter

GRIDS = (7, 14, 20, 28, 40)
QUICK_GRIDS = (3, 5)
HEADS, DIM, RATIO, METHOD = 6, 64, 1.9, "product"
OFFICIAL_V_MAX_L = 785  # (L, L, 64) fp32 gathered weights: 158 MB at 785, 656 MB at 1601


def variants(side: int) -> Dict[str, object]:
    """The four timed callables for an side x side grid plus one cls token."""
    ids = grid_ids(METHOD, RATIO, side, side, 1, "cpu")
    k, length = num_buckets(METHOD, RATIO, 1), ids.shape[0]
    table = torch.randn(1, HEADS, length, k)
    attn = torch.rand(1, HEADS, length, length).softmax(-1)
    weight = torch.randn(1, k, DIM)  # shared-head V table (official layout: H|1, nb, D)
    flat = official_flat_index(ids, k)
    fns = {
        "gather_irpe": lambda: rpe_gather(table, ids),
        "gather_official": lambda: official_gather(table, flat, length),
        "v_irpe": lambda: torch.matmul(rpe_scatter(attn, ids, k), weight.unsqueeze(0)),
    }
    if length <= OFFICIAL_V_MAX_L:
        fns["v_official"] = lambda: torch.einsum("bhij,hijd->bhid", attn, weight[:, ids])
    # same numbers both ways (checked once, outside the timing)
    assert torch.equal(fns["gather_irpe"](), fns["gather_official"]())
    if "v_official" in fns:
        torch.testing.assert_close(fns["v_irpe"](), fns["v_official"](), rtol=1e-4, atol=1e-5)
    return fns


def measure(grids, repeats: int, warmup: int) -> Dict[int, Dict]:
    rows = {}
    with torch.inference_mode():
        for side in grids:
            fns = variants(side)
            times = time_round_robin(fns, repeats, warmup, min_sample_s=0.05)
            length = side * side + 1
            rows[length] = {key: {"median_ms": median_ms(ts), "samples_ms": [t * 1e3 for t in ts]}
                            for key, ts in times.items()}
            print(f"  L={length}: " + ", ".join(f"{k} {v['median_ms']:.2f} ms"
                                                for k, v in rows[length].items()), flush=True)
    return rows


def summarize(rows: Dict[int, Dict]) -> Dict[str, Dict]:
    """Ratios official / irpe and growth exponents per variant."""
    lengths = sorted(rows)
    summary = {}
    for key in ("gather_irpe", "gather_official", "v_irpe", "v_official"):
        ms = [rows[n][key]["median_ms"] if key in rows[n] else None for n in lengths]
        summary[key] = {"median_ms": ms, "growth": growth(lengths, ms)}
    for path in ("gather", "v"):
        summary[f"{path}_speedup"] = [
            (rows[n][f"{path}_official"]["median_ms"] / rows[n][f"{path}_irpe"]["median_ms"])
            if f"{path}_official" in rows[n] else None for n in lengths]
    return summary


def report(result: Dict, out_dir: Path) -> Path:
    lengths, s = result["lengths"], result["summary"]
    header = ["L", "gather irpe ms", "gather official ms", "x", "p irpe", "p official",
              "V irpe ms", "V official ms", "x", "p irpe", "p official"]
    rows = []
    for i, n in enumerate(lengths):
        values = []
        for path in ("gather", "v"):
            values += [s[f"{path}_irpe"]["median_ms"][i], s[f"{path}_official"]["median_ms"][i],
                       s[f"{path}_speedup"][i], s[f"{path}_irpe"]["growth"][i],
                       s[f"{path}_official"]["growth"][i]]
        rows.append([str(n)] + [fmt(v, ".2f") for v in values])
    notes = [f"{result['device']}, torch {result['torch']}, {result['threads']} threads, "
             f"batch 1, {HEADS} heads, {METHOD} ratio {RATIO} ({result['num_buckets']} buckets), "
             f"head dim {DIM}; median of {result['repeats']} round-robin rounds, "
             "each sample >= 50 ms of back-to-back calls.",
             "x = official / irpe time; p = growth exponent (t ~ L^p) from the previous row. "
             f"The official V path gathers an (L, L, {DIM}) weight tensor and is skipped above "
             f"L = {OFFICIAL_V_MAX_L}."]
    return write_report(result, out_dir, "ops_cpu",
                        f"iRPE ops on CPU vs official ({result['device']})", header, rows, notes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 1 thread by default: on the shared 2-core machines, 2-thread timings of ms-scale ops
    # swing by 10x whenever another process runs; ratios in one thread stay stable.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="tiny grids, 1 round: checks the report")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    args = parser.parse_args(argv)
    grids = QUICK_GRIDS if args.quick else GRIDS
    if args.quick:
        args.repeats, args.warmup = 1, 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"iRPE op benchmark (CPU): L = {[g * g + 1 for g in grids]}, {args.threads} threads",
          flush=True)
    rows = measure(grids, args.repeats, args.warmup)
    result = {"device": device_name(), **env_info(), "repeats": args.repeats, "quick": args.quick,
              "num_buckets": num_buckets(METHOD, RATIO, 1), "lengths": sorted(rows),
              "results": {str(n): r for n, r in rows.items()}, "summary": summarize(rows)}
    out_dir = args.out or Path(__file__).parent / "results" / result["device"]
    print(report(result, out_dir).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
