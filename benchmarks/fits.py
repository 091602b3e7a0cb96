"""Growth exponents of op cost vs sequence length (t ~ L^p): local, and fitted per series.

Shared by the op benchmarks (ops_cpu, ops_bench), the report and its plots; no torch.
"""
from __future__ import annotations

import math
from collections import defaultdict
from itertools import pairwise
from typing import Dict, List, Sequence

__all__ = ["growth", "fit_slope", "series_key", "fit_rows", "fits"]


def growth(sizes: Sequence[int], values: Sequence[float]) -> List[float | None]:
    """Local exponent p of value ~ size^p between consecutive sizes (None for the first)."""
    out: List[float | None] = [None]
    for (s0, v0), (s1, v1) in pairwise(zip(sizes, values, strict=True)):
        ok = v0 and v1 and v0 > 0 and v1 > 0
        out.append(math.log(v1 / v0) / math.log(s1 / s0) if ok else None)
    return out


def fit_slope(sizes: Sequence[float], values: Sequence[float | None]) -> float | None:
    """Least-squares slope p of log(value) = p log(size) + c (None with < 2 usable points)."""
    pts = [(math.log(s), math.log(v))
           for s, v in zip(sizes, values, strict=True) if v and v > 0 and s > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return (sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts))


def series_key(row: Dict) -> str:
    """One fitted series per op (CPU) or per op and dtype (CUDA)."""
    return f"cuda {row['op']} {row['dtype']}" if row.get("device") == "cuda" else row["op"]


def fit_rows(results: List[Dict]) -> List[Dict]:
    """Rows that belong on a cost-vs-L curve (CUDA: the DETR cases, same batch and heads)."""
    return [r for r in results
            if r.get("device") != "cuda" or r.get("case", "").startswith("detr")]


def fits(results: List[Dict]) -> List[Dict]:
    """Least-squares log-log slope of median ms vs L per series."""
    groups: Dict[str, List[Dict]] = defaultdict(list)
    for r in fit_rows(results):
        groups[series_key(r)].append(r)
    out = []
    for key, rs in groups.items():
        lengths = [r["L"] for r in rs]
        out.append({"op": key, "slope": fit_slope(lengths, [r["median_ms"] for r in rs]),
                    "lengths": sorted(lengths), "points": len(rs)})
    return out
