"""Shared pieces of the op benchmarks (ops_cpu, ops_gpu): round-robin timing and reports."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

from irpe.bucket import bucket_ids


def official_flat_index(ids: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """The official rpe_k lookup index: row i's ids offset by i*K into the flattened table."""
    lq = ids.shape[0]
    return (ids + torch.arange(lq, device=ids.device).view(lq, 1) * num_buckets).flatten()


def official_gather(table: torch.Tensor, flat: torch.Tensor, lk: int) -> torch.Tensor:
    """table[B,H,Lq,K] -> [B,H,Lq,Lk] the official way: index the flattened (Lq*K) table."""
    b, h, lq, _ = table.shape
    return table.reshape(b, h, -1)[:, :, flat].view(b, h, lq, lk)


def grid_ids(method: str, ratio: float, height: int, width: int, skip: int,
             device) -> torch.Tensor:
    return bucket_ids(method, ratio, height, width, skip).to(device)


def time_round_robin(fns: Dict[str, Callable[[], object]], repeats: int, warmup: int,
                     sync: Callable[[], None] = lambda: None, min_sample_s: float = 0.0,
                     timer: Callable[[Callable], float] | None = None) -> Dict[str, List[float]]:
    """Seconds per call of each function, interleaved so machine drift hits all alike.

    Each sample times enough back-to-back calls to last >= min_sample_s (calibrated once per
    function; the time is divided back per call). `timer` replaces the wall clock (the GPU
    benchmark passes a CUDA-event timer)."""
    def wall(fn):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    timer = timer or wall
    calls = {}
    for key, fn in fns.items():
        once = max(timer(fn), 1e-7)  # also a warm-up call
        calls[key] = max(1, min(1000, int(min_sample_s / once) + 1)) if min_sample_s else 1
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for round_ in range(warmup + repeats):
        for key, fn in fns.items():
            n = calls[key]
            elapsed = timer(lambda fn=fn, n=n: [fn() for _ in range(n)]) / n
            if round_ >= warmup:
                times[key].append(elapsed)
    return times


def median_ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1e3


def write_report(result: Dict, out_dir: Path, name: str, title: str, header: Sequence[str],
                 rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> Path:
    """result -> NAME.json; a Markdown table (+ notes) -> NAME.md. Returns the .md path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# {title}", "", *notes, "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    path = out_dir / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def env_info() -> Dict:
    return {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "threads": torch.get_num_threads()}
