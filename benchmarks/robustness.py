"""Load and soak of a real ``irpe serve`` process on 127.0.0.1 (bounded, loopback only).

1. capacity: closed loop, ``max_batch_size`` clients for a few seconds -> requests/s;
2. overload: open loop at ``factor`` x capacity for ``--overload-s`` -> every request must be
   answered 200 or 503 (none lost, no other status); p50/p99 of the accepted ones;
3. soak: closed loop at capacity for ``--soak-s`` -> server RSS growth (%) after warm-up.

    python -m benchmarks.robustness --overload-s 60 --soak-s 120 --out benchmarks/results/...
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import httpx
import numpy as np

__all__ = ["serve_process", "capacity", "overload", "soak", "run", "main"]

PATH = "/v1/models/cls/classify"
PNG = {"content-type": "image/png"}


def _model_file(folder: Path) -> Path:
    """The untrained demo classifier in trained-model format (tiny, CPU friendly)."""
    import torch
    from irpe.artifact import default_spec, save_trained
    from irpe.data.shapes import SHAPE_CLASSES
    from irpe.models import create_model
    torch.manual_seed(0)
    path = folder / "cls.safetensors"
    save_trained(create_model("deit_shapes_irpe").eval(), str(path),
                 default_spec("deit_shapes_irpe", list(SHAPE_CLASSES)))
    return path


@contextmanager
def serve_process(max_batch: int = 8, queue: int = 32) -> Iterator[Tuple[str, int]]:
    """``irpe serve`` in a subprocess (1 thread); yields (base URL, pid), SIGTERM on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "robust.yaml"
        repo.write_text(f"threads: 1\nlog_level: warning\nmodels:\n  - {{name: cls, path: "
                        f"{_model_file(Path(tmp))}, max_batch_size: {max_batch}, "
                        f"max_queue_size: {queue}, max_queue_delay_ms: 5}}\n")
        env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", str(repo), "--port",
                                 "0", "--log-level", "info"], stderr=subprocess.PIPE,
                                text=True, env=env)
        try:
            yield _serving_url(proc), proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _serving_url(proc: subprocess.Popen) -> str:
    from serve.testing import wait_ready
    for line in proc.stderr:
        entry = json.loads(line)
        if entry.get("message") == "serving":
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            wait_ready(entry["url"])
            return entry["url"]
    raise RuntimeError(f"server exited with {proc.wait()}")


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def image() -> bytes:
    """One small PNG from the shapes data set."""
    import io
    from irpe.data.shapes import render_classification
    buf = io.BytesIO()
    render_classification(7, 0, 64)[0].save(buf, "PNG")
    return buf.getvalue()


async def _one(client: httpx.AsyncClient, blob: bytes, out: List[Tuple[int, float]]) -> None:
    start = time.perf_counter()
    try:
        r = await client.post(PATH, content=blob, headers=PNG)
        out.append((r.status_code, time.perf_counter() - start))
    except httpx.HTTPError as exc:  # a lost request: no HTTP answer at all
        out.append((-1, time.perf_counter() - start))
        print(f"lost: {type(exc).__name__}: {exc}", file=sys.stderr)


async def _closed_loop(url: str, clients: int, seconds: float, blob: bytes,
                       probe=None) -> List[Tuple[int, float]]:
    out: List[Tuple[int, float]] = []
    end = time.monotonic() + seconds

    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            await _one(client, blob, out)

    async with _client(url) as client:
        tasks = [asyncio.create_task(client_loop(client)) for _ in range(clients)]
        while probe is not None and time.monotonic() < end:
            probe()
            await asyncio.sleep(1.0)
        await asyncio.gather(*tasks)
    return out


def _client(url: str) -> httpx.AsyncClient:
    # idle connections expire on the client (1 s) well before uvicorn's 5 s keep-alive timeout:
    # with both at 5 s a request sent on a connection the server is closing fails (ReadError)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256,
                          keepalive_expiry=1.0)
    return httpx.AsyncClient(base_url=url, timeout=120, limits=limits)


def capacity(url: str, clients: int, seconds: float, blob: bytes) -> float:
    """Sustained requests/s of the server with ``clients`` concurrent closed-loop clients."""
    results = asyncio.run(_closed_loop(url, clients, seconds, blob))
    return sum(1 for s, _ in results if s == 200) / seconds


async def _open_loop(url: str, rate: float, seconds: float, blob: bytes
                     ) -> List[Tuple[int, float]]:
    out: List[Tuple[int, float]] = []
    tasks, start = [], time.monotonic()
    async with _client(url) as client:
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(_one(client, blob, out)))
        await asyncio.gather(*tasks)
    return out


def overload(url: str, rate: float, seconds: float, blob: bytes) -> Dict:
    """Open-loop load at ``rate`` requests/s: status counts and accepted-latency percentiles."""
    start = time.monotonic()
    results = asyncio.run(_open_loop(url, rate, seconds, blob))
    wall = time.monotonic() - start  # > seconds when the generator cannot keep the rate
    codes = Counter(s for s, _ in results)
    ok = np.array([t for s, t in results if s == 200]) * 1000
    return {"rate_rps": round(rate, 1), "seconds": seconds, "sent": int(rate * seconds),
            "wall_s": round(wall, 1), "offered_rps": round(len(results) / wall, 1),
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
    codes = Counter(s for s, _ in results)
    return {"seconds": seconds, "clients": clients, "requests": len(results),
            "status": {str(k): v for k, v in sorted(codes.items())},
            "rss_start_mib": round(samples[0], 1), "rss_warm_mib": round(base, 1),
            "rss_end_mib": round(samples[-1], 1), "rss_max_mib": round(max(samples), 1),
            "rss_growth_pct": round(100 * (samples[-1] - base) / base, 2)}


def run(overload_s: float, soak_s: float, factor: float = 4.0, max_batch: int = 8,
        calibrate_s: float = 3.0) -> Dict:
    """Capacity, overload and soak against one fresh server process."""
    blob = image()
    with serve_process(max_batch) as (url, pid):
        capacity(url, max_batch, 1.0, blob)  # warm the connection pool and the model
        cap = capacity(url, max_batch, calibrate_s, blob)
        _progress(f"capacity {cap:.1f} req/s; overload at {factor:g}x for {overload_s:g} s")
        over = overload(url, factor * cap, overload_s, blob)
        _progress(f"overload done: {over['status']}; soak for {soak_s:g} s")
        time.sleep(2.0)
        soaked = soak(url, pid, max_batch, soak_s, blob)
    return {"machine": _machine(), "model": "deit_shapes_irpe (untrained), torch, 1 thread",
            "max_batch_size": max_batch, "capacity_rps": round(cap, 1), "factor": factor,
            "overload": over, "soak": soaked}


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _machine() -> Dict:
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "caveat": "shared machine, 2 cores, load generator on the same cores as the server"}


def markdown(result: Dict) -> str:
    """A short report of ``run``'s result."""
    o, s = result["overload"], result["soak"]
    return "\n".join([
        "# Robustness: load and soak", "",
        f"Machine: {result['machine']['platform']}, {result['machine']['cpus']} CPUs. "
        f"Caveat: {result['machine']['caveat']}; figures are indicative only.", "",
        f"Model: {result['model']}, max_batch_size {result['max_batch_size']}.", "",
        "| measure | value |", "|---|---|",
        f"| capacity (closed loop) | {result['capacity_rps']} req/s |",
        f"| overload rate ({result['factor']:g}x for {o['seconds']:g} s) | {o['rate_rps']} "
        "req/s |",
        f"| achieved: wall / offered rate | {o['wall_s']} s / {o['offered_rps']} req/s |",
        f"| sent / answered / lost | {o['sent']} / {o['answered']} / {o['lost']} |",
        f"| statuses | {o['status']} |", f"| other 5xx | {o['other_5xx']} |",
        f"| accepted p50 / p99 | {o['accepted_p50_ms']} / {o['accepted_p99_ms']} ms |",
        f"| soak | {s['seconds']:g} s, {s['requests']} requests, statuses {s['status']} |",
        f"| RSS start / warm / end / max | {s['rss_start_mib']} / {s['rss_warm_mib']} / "
        f"{s['rss_end_mib']} / {s['rss_max_mib']} MiB |",
        f"| RSS growth after warm-up | {s['rss_growth_pct']} % |", ""])


def main(argv: Optional[List[str]] = None) -> int:
    """CLI: run, print the report, optionally write <out>.json / <out>.md."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.robustness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--overload-s", type=float, default=60.0)
    p.add_argument("--soak-s", type=float, default=300.0)
    p.add_argument("--factor", type=float, default=4.0, help="overload rate / capacity")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--out", help="path prefix of the .json / .md results")
    args = p.parse_args(argv)
    result = run(args.overload_s, args.soak_s, args.factor, args.max_batch)
    report = markdown(result)
    print(report)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
        Path(f"{args.out}.md").write_text(report)
    o = result["overload"]
    return 0 if o["lost"] == 0 and o["other_5xx"] == 0 and set(o["status"]) <= {"200", "503"} \
        else 1


if __name__ == "__main__":
    sys.exit(main())
