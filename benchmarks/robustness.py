"""Load and soak of a real ``irpe serve`` process on 127.0.0.1 (bounded, loopback only).

1. capacity: closed loop, ``max_batch_size`` clients for a few seconds -> requests/s;
2. overload: open loop at ``factor`` x capacity for ``--overload-s`` -> every request must be
   answered 200 or 503 (none lost, no other status); p50/p99 of the accepted ones;
3. soak: closed loop at capacity for ``--soak-s`` -> server RSS growth (%) after warm-up.

``--server-cpus`` / ``--client-cpus`` pin the server process and this load generator to
separate CPUs (``sched_setaffinity``), so the generator does not steal the server's core.

    python -m benchmarks.robustness --server-cpus 1 --client-cpus 0 --overload-s 60 \
        --soak-s 300 --out benchmarks/results/...
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import numpy as np

from benchmarks.rawhttp import LeanClient, Lost
from benchmarks.serve_process import start_serve, stop, wait_ready

__all__ = ["serve_process", "pinned", "capacity", "overload", "soak", "run", "passed", "main"]

PATH = "/v1/models/cls/classify"
PNG = {"content-type": "image/png"}
Result = Tuple[int, float, float, float]  # status (-1 = lost), seconds, start lag, start time


def _model_file(folder: Path) -> Path:
    """The untrained demo classifier in trained-model format (tiny, CPU friendly)."""
    import torch

    from irpe.artifact.trained import default_spec, save_trained
    from irpe.data.shapes import SHAPE_CLASSES
    from irpe.models import create_model
    torch.manual_seed(0)
    path = folder / "cls.safetensors"
    save_trained(create_model("deit_shapes_irpe").eval(), str(path),
                 default_spec("deit_shapes_irpe", list(SHAPE_CLASSES)))
    return path


@contextmanager
def serve_process(max_batch: int = 8, queue: int = 32,
                  cpus: Optional[Set[int]] = None) -> Iterator[Tuple[str, int]]:
    """``irpe serve`` in a subprocess (1 thread, on ``cpus`` if given); yields (base URL, pid),
    SIGTERM on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "robust.yaml"
        repo.write_text(f"threads: 1\nlog_level: warning\nmodels:\n  - {{name: cls, path: "
                        f"{_model_file(Path(tmp))}, max_batch_size: {max_batch}, "
                        f"max_queue_size: {queue}, max_queue_delay_ms: 5}}\n")
        proc, url = start_serve([str(repo)], env={"OMP_NUM_THREADS": "1"},
                                preexec_fn=_pin(cpus))
        try:
            wait_ready(url)
            yield url, proc.pid
        finally:
            stop(proc)


def _pin(cpus: Optional[Set[int]]):
    """A preexec_fn that pins the child (and every thread it starts) to ``cpus``."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


@contextmanager
def pinned(cpus: Optional[Set[int]]) -> Iterator[None]:
    """Run this (the generator's) thread on ``cpus``, then restore its affinity."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def image() -> bytes:
    """One small PNG from the shapes data set."""

    from irpe.data.shapes import render_classification
    buf = io.BytesIO()
    render_classification(7, 0, 64)[0].save(buf, "PNG")
    return buf.getvalue()


async def _one(client: LeanClient, out: List[Result], due: Optional[float] = None) -> None:
    """One request -> (status or -1 when lost, seconds, start lag behind ``due``, start);
    it starts when a connection is free (at most 256, like a browser or proxy pool)."""
    async with client.slots:
        start = time.perf_counter()
        lag = 0.0 if due is None else start - due
        try:
            status, _ = await client.post()
            out.append((status, time.perf_counter() - start, lag, start))
        except Lost as exc:  # a lost request: no HTTP answer at all
            out.append((-1, time.perf_counter() - start, lag, start))
            print(f"lost: {exc}", file=sys.stderr)


def _client(url: str, blob: bytes) -> LeanClient:
    # idle connections expire on the client (1 s) well before uvicorn's 5 s keep-alive timeout:
    # with both at 5 s a request sent on a connection the server is closing fails (ReadError)
    return LeanClient(url, PATH, blob, PNG, keepalive_s=1.0)


async def _closed_loop(url: str, clients: int, seconds: float, blob: bytes,
                       probe=None) -> List[Result]:
    out: List[Result] = []
    end = time.monotonic() + seconds
    client = _client(url, blob)

    async def client_loop() -> None:
        while time.monotonic() < end:
            await _one(client, out)

    tasks = [asyncio.create_task(client_loop()) for _ in range(clients)]
    while probe is not None and time.monotonic() < end:
        probe()
        await asyncio.sleep(1.0)
    await asyncio.gather(*tasks)
    await client.aclose()
    return out


def capacity(url: str, clients: int, seconds: float, blob: bytes) -> float:
    """Sustained requests/s of the server with ``clients`` concurrent closed-loop clients."""
    results = asyncio.run(_closed_loop(url, clients, seconds, blob))
    return sum(1 for r in results if r[0] == 200) / seconds


async def _open_loop(url: str, rate: float, seconds: float, blob: bytes
                     ) -> List[Result]:
    out: List[Result] = []
    tasks, start, client = [], time.perf_counter(), _client(url, blob)
    for i in range(int(rate * seconds)):
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(_one(client, out, due)))
    await asyncio.gather(*tasks)
    await client.aclose()
    return out


def overload(url: str, rate: float, seconds: float, blob: bytes, pid: Optional[int] = None
             ) -> Dict:
    """Open-loop load at ``rate`` requests/s: status counts, accepted-latency percentiles, and
    how well the generator kept the schedule (achieved rate, start lag, CPU use)."""
    cpu0, server0 = time.process_time(), cpu_seconds(pid) if pid else 0.0
    start = time.monotonic()
    results = asyncio.run(_open_loop(url, rate, seconds, blob))
    wall = time.monotonic() - start  # > seconds when the generator cannot keep the rate
    codes = Counter(r[0] for r in results)
    ok = np.array([r[1] for r in results if r[0] == 200]) * 1000
    lag = np.array([r[2] for r in results]) * 1000
    starts = [r[3] for r in results]
    send_s = max(starts) - min(starts) + 1 / rate  # n requests span n intervals
    return {"rate_rps": round(rate, 1), "seconds": seconds, "sent": int(rate * seconds),
            "wall_s": round(wall, 1), "offered_rps": round(len(results) / send_s, 1),
            "offered_pct_of_target": round(100 * len(results) / send_s / rate, 1),
            "start_lag_p50_ms": _pct(lag, 50), "start_lag_p99_ms": _pct(lag, 99),
            "client_cpu_pct": round(100 * (time.process_time() - cpu0) / wall, 1),
            "server_cpu_pct": round(100 * (cpu_seconds(pid) - server0) / wall, 1) if pid
            else None,
            "answered": len(results) - codes.get(-1, 0), "lost": codes.get(-1, 0),
            "status": {str(k): v for k, v in sorted(codes.items())},
            "other_5xx": sum(v for k, v in codes.items() if k >= 500 and k != 503),
            "accepted_p50_ms": _pct(ok, 50), "accepted_p99_ms": _pct(ok, 99)}


def _pct(values: np.ndarray, q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)), 1) if len(values) else None


def soak(url: str, pid: int, clients: int, seconds: float, blob: bytes) -> Dict:
    """Closed loop at capacity; RSS sampled every second, growth measured after warm-up."""
    samples: List[float] = []
    results = asyncio.run(_closed_loop(url, clients, seconds, blob,
                                       probe=lambda: samples.append(rss_mib(pid))))
    samples.append(rss_mib(pid))
    base = samples[max(1, len(samples) // 10)] if len(samples) > 2 else samples[0]
    codes = Counter(r[0] for r in results)
    return {"seconds": seconds, "clients": clients, "requests": len(results),
            "status": {str(k): v for k, v in sorted(codes.items())},
            "rss_start_mib": round(samples[0], 1), "rss_warm_mib": round(base, 1),
            "rss_end_mib": round(samples[-1], 1), "rss_max_mib": round(max(samples), 1),
            "rss_growth_pct": round(100 * (samples[-1] - base) / base, 2)}


def run(overload_s: float, soak_s: float, factor: float = 4.0, max_batch: int = 8,
        calibrate_s: float = 3.0, server_cpus: Optional[Set[int]] = None,
        client_cpus: Optional[Set[int]] = None) -> Dict:
    """Capacity, overload and soak against one fresh server process (optionally pinned)."""
    blob = image()
    with serve_process(max_batch, cpus=server_cpus) as (url, pid), pinned(client_cpus):
        capacity(url, max_batch, 1.0, blob)  # warm the connection pool and the model
        cap = capacity(url, max_batch, calibrate_s, blob)
        _progress(f"capacity {cap:.1f} req/s; overload at {factor:g}x for {overload_s:g} s")
        over = overload(url, factor * cap, overload_s, blob, pid)
        _progress(f"overload done: offered {over['offered_rps']} req/s "
                  f"({over['offered_pct_of_target']} % of target), {over['status']}; "
                  f"soak for {soak_s:g} s")
        time.sleep(2.0)
        soaked = soak(url, pid, max_batch, soak_s, blob)
    return {"machine": _machine(server_cpus, client_cpus),
            "model": "deit_shapes_irpe (untrained), torch, 1 thread",
            "max_batch_size": max_batch, "capacity_rps": round(cap, 1), "factor": factor,
            "overload": over, "soak": soaked}


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _machine(server_cpus: Optional[Set[int]], client_cpus: Optional[Set[int]]) -> Dict:
    shared = server_cpus is None or client_cpus is None or server_cpus & client_cpus
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "server_cpus": sorted(server_cpus) if server_cpus else "any",
            "client_cpus": sorted(client_cpus) if client_cpus else "any",
            "caveat": "shared machine; load generator on the same cores as the server" if shared
            else "shared machine; server and load generator pinned to separate cores"}


def markdown(result: Dict) -> str:
    """A short report of ``run``'s result."""
    o, s, m = result["overload"], result["soak"], result["machine"]
    return "\n".join([
        "# Robustness: load and soak", "",
        f"Machine: {m['platform']}, {m['cpus']} CPUs; server on CPUs {m.get('server_cpus')}, "
        f"load generator on CPUs {m.get('client_cpus')}. Caveat: {m['caveat']}.", "",
        f"Model: {result['model']}, max_batch_size {result['max_batch_size']}.", "",
        "| measure | value |", "|---|---|",
        f"| capacity (closed loop) | {result['capacity_rps']} req/s |",
        f"| target overload rate ({result['factor']:g}x for {o['seconds']:g} s) | "
        f"{o['rate_rps']} req/s |",
        f"| achieved offered rate | {o['offered_rps']} req/s "
        f"({o.get('offered_pct_of_target')} % of target); wall {o['wall_s']} s |",
        f"| request start lag behind schedule p50 / p99 | {o.get('start_lag_p50_ms')} / "
        f"{o.get('start_lag_p99_ms')} ms |",
        f"| CPU during overload: generator / server | {o.get('client_cpu_pct')} % / "
        f"{o.get('server_cpu_pct')} % of one core |",
        f"| sent / answered / lost | {o['sent']} / {o['answered']} / {o['lost']} |",
        f"| statuses | {o['status']} |", f"| other 5xx | {o['other_5xx']} |",
        f"| accepted p50 / p99 | {o['accepted_p50_ms']} / {o['accepted_p99_ms']} ms |",
        f"| soak | {s['seconds']:g} s, {s['requests']} requests, statuses {s['status']} |",
        f"| RSS start / warm / end / max | {s['rss_start_mib']} / {s['rss_warm_mib']} / "
        f"{s['rss_end_mib']} / {s['rss_max_mib']} MiB |",
        f"| RSS growth after warm-up | {s['rss_growth_pct']} % |", ""])


def passed(result: Dict) -> bool:
    """Acceptance: no lost request, only 200/503 under overload, soak RSS growth < 10 %."""
    o = result["overload"]
    return o["lost"] == 0 and o["other_5xx"] == 0 and set(o["status"]) <= {"200", "503"} \
        and result["soak"]["rss_growth_pct"] < 10


def _cpus(text: str) -> Set[int]:
    """'0', '0,1' or '0-3' -> a CPU set."""
    cpus: Set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def main(argv: Optional[List[str]] = None) -> int:
    """CLI: run, print the report, optionally write <out>.json / <out>.md; 1 if not passed."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.robustness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--overload-s", type=float, default=60.0)
    p.add_argument("--soak-s", type=float, default=300.0)
    p.add_argument("--factor", type=float, default=4.0, help="overload rate / capacity")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--server-cpus", type=_cpus, help="pin the server to these CPUs (0,1 / 2-3)")
    p.add_argument("--client-cpus", type=_cpus, help="pin the load generator to these CPUs")
    p.add_argument("--out", help="path prefix of the .json / .md results")
    args = p.parse_args(argv)
    result = run(args.overload_s, args.soak_s, args.factor, args.max_batch,
                 server_cpus=args.server_cpus, client_cpus=args.client_cpus)
    report = markdown(result)
    print(report)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
        Path(f"{args.out}.md").write_text(report)
    return 0 if passed(result) else 1


if __name__ == "__main__":
    sys.exit(main())
