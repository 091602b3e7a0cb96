"""`irpe bench ops`: benchmarks.ops_cpu measurements as rows of the bench report format.

On CPU it runs ops_cpu (iRPE gather/scatter vs the official formulations per L, with growth
exponents); the GPU op benchmark (benchmarks.ops_gpu) keeps its own report for now.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

OPS = ("gather_irpe", "gather_official", "v_irpe", "v_official")


def run(quick: bool, threads: int, repeats: int) -> Tuple[Dict, List[Dict]]:
    """(settings, rows): one row per (op, L) with median ms, growth p and speed-up."""
    from benchmarks import ops_cpu
    grids = ops_cpu.QUICK_GRIDS if quick else ops_cpu.GRIDS
    repeats, warmup = (1, 0) if quick else (repeats, 1)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    measured = ops_cpu.measure(grids, repeats, warmup)
    summary = ops_cpu.summarize(measured)
    settings = {"lengths": sorted(measured), "threads": threads, "repeats": repeats,
                "heads": ops_cpu.HEADS, "head_dim": ops_cpu.DIM, "method": ops_cpu.METHOD,
                "ratio": ops_cpu.RATIO, "quick": quick}
    return settings, rows(sorted(measured), summary)


def rows(lengths: List[int], summary: Dict) -> List[Dict]:
    """Flatten ops_cpu.summarize output into report rows."""
    out = []
    for op in OPS:
        path = op.split("_")[0]
        for i, length in enumerate(lengths):
            ms = summary[op]["median_ms"][i]
            if ms is None:
                continue
            speedup = summary[f"{path}_speedup"][i] if op.endswith("irpe") else None
            out.append({"op": op, "L": length, "median_ms": ms,
                        "growth": summary[op]["growth"][i], "speedup": speedup})
    return out
