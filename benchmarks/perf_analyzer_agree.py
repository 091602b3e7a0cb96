"""Our load generator against Triton's perf_analyzer, on one server, the same request.

``python -m benchmarks.perf_analyzer_agree [--concurrency 1,16] [--rounds 3] [--seconds 10]``:
one `irpe serve` (the demo classifier on the runtime it picks, batch 8, 5 ms delay: the
defaults) and, alternated per round and concurrency, closed-loop throughput of
benchmarks.serve_load's lean client (``irpe bench serve``'s HTTP side; ``--request v2-binary``:
one [1, 3, 64, 64] FP32 tensor per request to /v2 infer) and of ``perf_analyzer`` (its default
input: random FP32 bytes, binary tensors, the same shape) at the same concurrency. Prints each
pair and the median ratio per concurrency (issue 51: within 10%). Needs ``make perf-analyzer``.
"""
from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence
from urllib.parse import urlsplit

from benchmarks.common import int_list
from benchmarks.serve_load import lean_closed_loop, request_of, server_process, write_repository

__all__ = ["perf_analyzer_rate", "main"]


def perf_analyzer_rate(prefix: List[str], host: str, clients: int, seconds: float) -> float:
    """perf_analyzer's infer/s at ``clients`` concurrent requests: windows of ``seconds``, the
    last of 3 that agree within 10x (its stability check made a formality: the figure is one
    window's, like the lean client's)."""
    done = subprocess.run(prefix + ["-m", "deit_shapes_irpe", "-u", host, "--concurrency-range",
                                    str(clients), "-p", str(int(seconds * 1000)),
                                    "--stability-percentage", "1000"],
                          capture_output=True, text=True, timeout=seconds * 10 + 60)
    found = re.findall(r"Throughput: ([0-9.]+) infer/sec", done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"perf_analyzer failed ({done.returncode}): {done.stdout[-1500:]}"
                           f"{done.stderr[-1500:]}")
    return float(found[-1])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.perf_analyzer_agree",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--threads", type=int, default=2, help="server --threads")
    p.add_argument("--out", type=Path, help="write the report (Markdown) here too")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from benchmarks.ray_serve import finish_report
    from serve.demo import demo_models
    from tools.perf_analyzer import command

    args = _parser().parse_args(argv)
    prefix = command()
    if prefix is None:
        raise SystemExit("perf_analyzer is not prepared: make perf-analyzer")
    model = demo_models()[0]
    path, body, headers = request_of("v2-binary")
    lines = [f"# irpe bench serve's lean client vs perf_analyzer: {model.name} on {model.backend}"
             f", one [1, 3, 64, 64] FP32 tensor per request (binary), {args.threads} server "
             "threads", "", "| round | clients | lean client infer/s | perf_analyzer infer/s | "
             "ratio |", "|---|---|---|---|---|"]
    ratios: Dict[int, List[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp), [{"name": model.name, "path": model.path,
                                             "backend": model.backend}])
        with server_process(repo, args.threads) as url:
            for rnd in range(1, args.rounds + 1):
                for clients in int_list(args.concurrency):
                    ours = asyncio.run(lean_closed_loop(url, path, body, headers, clients,
                                                        args.seconds, 2.0))["images_per_s"]
                    theirs = perf_analyzer_rate(prefix, urlsplit(url).netloc, clients,
                                                args.seconds)
                    ratios.setdefault(clients, []).append(ours / theirs)
                    lines.append(f"| {rnd} | {clients} | {ours:.1f} | {theirs:.1f} | "
                                 f"{ours / theirs:.3f} |")
                    print(lines[-1], flush=True)
    lines += ["", "median ratio (goal within 0.90-1.10): " + ", ".join(
        f"{c} clients **{statistics.median(r):.3f}**" for c, r in ratios.items())]
    finish_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
