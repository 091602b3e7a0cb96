"""`irpe bench ops`: the op benchmarks as rows of the bench report format, with fitted slopes.

CPU rows come from benchmarks.ops_cpu (iRPE gather/scatter vs the official formulations per L).
On a CUDA machine the same command adds benchmarks.ops_gpu (our CUDA kernels vs torch and the
official gather, fp32/fp16); elsewhere it records why those rows are missing. Each op gets one
fitted growth exponent: the least-squares slope of log(time) vs log(L).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from benchmarks import ops_cpu, ops_gpu

OPS = ("gather_irpe", "gather_official", "v_irpe", "v_official")


def run(quick: bool, threads: int, repeats: int) -> Tuple[Dict, List[Dict]]:
    """(settings, rows): CPU rows per (op, L), then CUDA kernel rows when CUDA is up."""
    grids = ops_cpu.QUICK_GRIDS if quick else ops_cpu.GRIDS
    repeats, warmup = (1, 0) if quick else (repeats, 1)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    measured = ops_cpu.measure(grids, repeats, warmup)
    summary = ops_cpu.summarize(measured)
    gpu, why_not = gpu_rows(quick, repeats)
    settings = {"lengths": sorted(measured), "threads": threads, "repeats": repeats,
                "heads": ops_cpu.HEADS, "head_dim": ops_cpu.DIM, "method": ops_cpu.METHOD,
                "ratio": ops_cpu.RATIO, "quick": quick, "gpu_ops": why_not or "measured"}
    return settings, rows(sorted(measured), summary) + gpu


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


def gpu_rows(quick: bool, repeats: int) -> Tuple[List[Dict], Optional[str]]:
    """ops_gpu cases on CUDA as report rows, and why our kernels were not measured (or None)."""
    if not torch.cuda.is_available():
        return [], ("skipped: no CUDA device here (torch.cuda.is_available() is False); the "
                    "custom CUDA kernels (plugins/pytorch) run only on a GPU machine")
    ours, why_not = ops_gpu.load_ours("cuda")
    peak = ops_gpu.peak_tbps("cuda", None)
    cases = ops_gpu.QUICK_CASES if quick else ops_gpu.CASES
    out = []
    for name, case in cases.items():
        for dtype in ops_gpu.DTYPES:
            for r in ops_gpu.run_case(name, case, dtype, "cuda", ours, repeats, 1, peak):
                out.append(_gpu_row(r, case))
    return out, (f"torch references only; our kernels failed to load: {why_not}"
                 if why_not else None)


def _gpu_row(r: Dict, case: Tuple) -> Dict:
    """An ops_gpu row in the bench format (L = grid tokens + skip)."""
    b, h, _, _, gh, gw, skip = case
    return {"op": f"{r['op']}_{r['variant']}", "device": "cuda", "case": r["case"],
            "dtype": r["dtype"], "batch": b, "heads": h, "L": gh * gw + skip,
            "median_ms": r["median_ms"], "gb_per_s": r["gb_per_s"],
            "fraction_of_peak": r["fraction_of_peak"], "speedup": r["speedup_vs_torch"],
            "max_abs_diff": r["max_abs_diff"]}


def notes(settings: Dict) -> List[str]:
    """Report notes: what the fitted slope is; CUDA kernels measured or why not."""
    return ["fitted p = least-squares slope of log(median ms) vs log(L) over every L of the op "
            "(t ~ L^p; 2 = quadratic); growth p = local exponent from the previous L",
            f"custom CUDA kernels: {settings.get('gpu_ops', 'not recorded')}"]
