"""HTTP side of `irpe bench serve`: an `irpe serve` child process and an asyncio + httpx load.

The server runs as its own process (``python -m irpe serve REPO.yaml --port 0``), so the load
generator in the benchmark process does not share its GIL. Clients keep one HTTP/1.1
keep-alive connection per concurrent request (pool sized to the load), so connection set-up is
outside the timed steady state.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from benchmarks._serving import start_serve, stop, wait_ready
from benchmarks.report import latency_ms

__all__ = ["write_repository", "server_process", "closed_loop", "open_loop", "batch_histogram"]


def write_repository(folder: Path, models: List[Dict]) -> Path:
    """A model-repository YAML for ``models`` (ModelConfig dicts) in ``folder``."""
    import yaml
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bench_repository.yaml"
    path.write_text(yaml.safe_dump({"models": [{k: str(v) if isinstance(v, Path) else v
                                                for k, v in m.items()} for m in models]}))
    return path


@contextlib.contextmanager
def server_process(repository: Path, threads: int, timeout_s: float = 180.0) -> Iterator[str]:
    """Run `irpe serve REPOSITORY` in a child process until ready; yields its base URL."""
    log = repository.with_suffix(".log")
    proc, url = start_serve([str(repository), "--threads", str(threads)], log=log)
    try:
        wait_ready(url, timeout_s)
        yield url
    finally:
        stop(proc)


def _client(base: str, connections: int):
    import httpx
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                          keepalive_expiry=120)
    return httpx.AsyncClient(base_url=base, timeout=120, limits=limits)


async def _post(client, url: str, body: bytes, lat: Optional[List[float]],
                status: Counter, content_type: str = "image/png") -> None:
    start = time.perf_counter()
    try:
        r = await client.post(url, content=body, headers={"content-type": content_type})
        status[str(r.status_code)] += 1
        if r.status_code == 200 and lat is not None:
            lat.append(time.perf_counter() - start)
    except Exception as exc:  # connection errors count as errors, not crashes
        status[type(exc).__name__] += 1


async def _warm(client, url: str, body: bytes, n: int, content_type: str = "image/png") -> None:
    """Open ``n`` keep-alive connections (and warm the server) before timing."""
    await asyncio.gather(*(_post(client, url, body, None, Counter(), content_type)
                           for _ in range(n)))


async def closed_loop(base: str, url: str, clients: int, seconds: float, body: bytes,
                      content_type: str = "image/png") -> Dict:
    """``clients`` concurrent loops of request-after-response for ``seconds``."""
    lat: List[float] = []
    status: Counter = Counter()
    async with _client(base, clients) as client:
        await _warm(client, url, body, clients, content_type)
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await _post(client, url, body, lat, status, content_type)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return _row("closed", clients, lat, status, elapsed)


async def open_loop(base: str, url: str, rate: float, seconds: float, body: bytes,
                    content_type: str = "image/png") -> Dict:
    """Requests started every 1/rate s for ``seconds`` (no waiting on responses)."""
    lat: List[float] = []
    status: Counter = Counter()
    async with _client(base, 64) as client:
        await _warm(client, url, body, 4, content_type)
        start, tasks = time.perf_counter(), []
        for i in range(max(1, int(rate * seconds))):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(_post(client, url, body, lat, status,
                                                   content_type)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return _row("open", rate, lat, status, elapsed)


def _row(mode: str, load: float, lat: List[float], status: Counter, elapsed: float) -> Dict:
    errors = {k: v for k, v in status.items() if k != "200"}
    row = {"mode": mode, "load": load, "requests": sum(status.values()), "errors": errors,
           "images_per_s": len(lat) / elapsed, "seconds": elapsed}
    return row | (latency_ms(lat) if lat else {})


def batch_histogram(text: str, model: str) -> Dict[str, int]:
    """Batches per size bucket (non-cumulative) of ``model`` from /metrics exposition text."""
    cumulative = []
    for line in text.splitlines():
        if line.startswith("irpe_batch_size_bucket") and f'model="{model}"' in line:
            le = line.split('le="')[1].split('"')[0]
            cumulative.append((float(le), int(float(line.rsplit(" ", 1)[1]))))
    cumulative.sort()
    out, prev = {}, 0
    for le, count in cumulative:
        out["inf" if le == float("inf") else str(int(le))] = count - prev
        prev = count
    return {k: v for k, v in out.items() if v}
