"""Candidates for iRPE attention on CPU, one DeiT-S attention call, timed side by side.

    python -m benchmarks.cpu_attention_candidates [--repeats 30] [--threads 2] [--compile]

The native kernel (irpe.fused.cpu_library) is a candidate when it is built (make ort-ops).

Shapes of DeiT-S at batch 8 (B 8, H 6, L 197, d 64, product ratio 1.9, skip 1), q/k/v as strided
views of one qkv tensor like in the model, inference_mode, round-robin (one call of every
candidate per round), median and best per candidate, each relative to plain SDPA of the same
round. The candidates that lost stay here (not in irpe/) so their figures can be re-measured;
docs/DECISIONS.md (issue 31) records the outcome.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from irpe.attention import unfused_attention
from irpe.fused.cpu import attention_logits, cpu_attention, term_mask
from irpe.fused.cpu_library import cpu_library, library_attention, set_cpu_library
from irpe.rpe import build_rpe, get_rpe_config

Call = Callable[[], torch.Tensor]


def _setup(batch: int):
    torch.manual_seed(0)
    heads, length, dim = 6, 197, 64
    qkv = torch.randn(batch, length, 3, heads, dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cfg = get_rpe_config(1.9, "product", "ctx", True, 1, "qkv")
    mods = build_rpe(cfg, dim, heads, initializer=lambda p: torch.nn.init.normal_(p, std=0.02))
    return q, k, v, dim ** -0.5, mods


def _sdpa_path(q, k, v, scale, rq, rk, rv) -> torch.Tensor:
    """irpe.fused.cpu with the native kernel set aside (the SDPA formulation)."""
    set_cpu_library(None)
    try:
        return cpu_attention(q, k, v, scale, rq, rk, rv, None, None, None)
    finally:
        set_cpu_library(True)


def candidates(batch: int, compiled: bool) -> Dict[str, Call]:
    """name -> zero-argument call; names: <terms>:<formulation>."""
    q, k, v, scale, (rq, rk, rv) = _setup(batch)
    ids = rk.bucket_ids(q.shape[2]).to(torch.long)
    nb = rk.num_buckets
    onehot = torch.zeros(*ids.shape, nb).scatter_(2, ids.unsqueeze(-1), 1.0)

    def gather_mask() -> torch.Tensor:  # torch.gather instead of index_select on flat ids
        table = rk._table(q * scale)
        b, h, length, _ = table.shape
        mask = torch.gather(table, 3, ids.expand(b, h, length, length))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def qkv_onehot() -> torch.Tensor:  # V bucket sums as a batched matmul with a one-hot tensor
        qs = q * scale
        attn, shape = attention_logits(qs, k, term_mask(qs, k, scale, rq, rk, None, None, None))
        attn = attn.softmax(-1)
        sums = torch.einsum("bij,ijt->bit", attn, onehot).view(*shape[:3], nb)
        return (torch.matmul(attn.view(shape), v)
                + torch.matmul(sums, rv.lookup_table_weight.unsqueeze(0)))

    calls: Dict[str, Call] = {
        "plain:sdpa": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
        "k:unfused": lambda: unfused_attention(q, k, v, scale, None, rk, None),
        "k:sdpa_mask_gather": gather_mask,
        "k:sdpa_mask_index_select": lambda: _sdpa_path(q, k, v, scale, None, rk, None),
        "qkv:unfused": lambda: unfused_attention(q, k, v, scale, rq, rk, rv),
        "qkv:one_pass_scatter_add": lambda: _sdpa_path(q, k, v, scale, rq, rk, rv),
        "qkv:one_pass_onehot_bmm": qkv_onehot,
    }
    if cpu_library() is not None:  # the native kernel (make ort-ops)
        calls["k:native_kernel"] = lambda: library_attention(q, k, v, scale, None, rk, None,
                                                             None, None)
        calls["qkv:native_kernel"] = lambda: library_attention(q, k, v, scale, rq, rk, rv,
                                                               None, None)
    if compiled:  # inductor (C++/OpenMP) kernels of the unfused formulation
        for terms, mods in (("k", (None, rk, None)), ("qkv", (rq, rk, rv))):
            fn = torch.compile(unfused_attention, dynamic=False)
            calls[f"{terms}:inductor"] = (lambda fn=fn, mods=mods:
                                          fn(q, k, v, scale, *mods))
    return calls


def measure(calls: Dict[str, Call], repeats: int, warmup: int) -> Dict[str, List[float]]:
    times: Dict[str, List[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for round_ in range(warmup + repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                if round_ >= warmup:
                    times[name].append(time.perf_counter() - start)
    return times


def report(times: Dict[str, List[float]]) -> List[str]:
    plain = times["plain:sdpa"]
    lines = ["| candidate | median ms | best ms | median of round ratios (time / plain) |",
             "|---|---|---|---|"]
    for name, ts in times.items():
        rounds = statistics.median(t / p for t, p in zip(ts, plain, strict=True))
        lines.append(f"| {name} | {statistics.median(ts) * 1e3:.2f} | {min(ts) * 1e3:.2f} | "
                     f"{rounds:.2f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="add torch.compile candidates")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    times = measure(candidates(args.batch, args.compile), args.repeats, args.warmup)
    print(f"one DeiT-S attention call, batch {args.batch}, {args.threads} threads, torch "
          f"{torch.__version__}, {args.repeats} rounds; load {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f}\n")
    print("\n".join(report(times)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
