"""HTTP side of `irpe bench serve`: an `irpe serve` child process and an asyncio + httpx load.

The server runs as its own process (``python -m irpe serve REPO.yaml --port 0``), so the load
generator in the benchmark process does not share its GIL. Clients keep one HTTP/1.1
keep-alive connection per concurrent request (pool sized to the load), so connection set-up is
outside the timed steady state.

``python -m benchmarks.serve_load``: tail latency at saturation. The demo classifier's ONNX file
behind `irpe serve` (batch 8, 5 ms delay), closed-loop clients on the lean client
(benchmarks.rawhttp) sending one JSON-base64 image per request (``--request v2-json`` /
``v2-binary``: FP32 tensors to /v2 infer instead); p50/p90/p99 and p99/p50 per concurrency.
``--baseline DIR`` serves the same model from another checkout (e.g. the unchanged code) in a
second process, ``--gc-freeze-off`` from this one with ``gc_freeze: false``; the
servers alternate at every level of every round.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from benchmarks.common import int_list
from benchmarks.rawhttp import LeanClient, Lost
from benchmarks.report import latency_ms, percentile
from benchmarks.serve_process import start_serve, stop, wait_ready

__all__ = ["write_repository", "server_process", "closed_loop", "open_loop", "batch_histogram",
           "lean_closed_loop", "png", "request_of", "main"]


def write_repository(folder: Path, models: List[Dict], **settings) -> Path:
    """A model-repository YAML for ``models`` (ModelConfig dicts) and server ``settings`` in
    ``folder``."""
    import yaml
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bench_repository.yaml"
    path.write_text(yaml.safe_dump({**settings, "models": [
        {k: str(v) if isinstance(v, Path) else v for k, v in m.items()} for m in models]}))
    return path


@contextlib.contextmanager
def server_process(repository: Path, threads: int, timeout_s: float = 180.0,
                   root: Optional[Path] = None) -> Iterator[str]:
    """Run `irpe serve REPOSITORY` (from the checkout ``root``, default this one) in a child
    process until ready; yields its base URL."""
    log = repository.with_suffix(".log")
    proc, url = start_serve([str(repository), "--threads", str(threads)], log=log, root=root)
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


# ------------------------------------------------------------------ python -m benchmarks.serve_load

async def lean_closed_loop(base: str, path: str, body: bytes, headers: Dict[str, str],
                           clients: int, seconds: float, warmup_s: float) -> Dict:
    """``clients`` request-after-response loops on the lean client for ``warmup_s`` (not
    recorded) + ``seconds``: the steady state of a saturated server, not its ramp-up."""
    client = LeanClient(base, path, body, headers, keepalive_s=60.0, max_connections=clients)
    lat: List[float] = []
    sent_at: List[float] = []
    status: Counter = Counter()
    start = time.perf_counter()
    measure, end = start + warmup_s, start + warmup_s + seconds

    async def worker() -> None:
        while (sent := time.perf_counter()) < end:
            try:
                code, _ = await client.post()
            except Lost as exc:
                code = type(exc).__name__
            if sent >= measure:
                status[str(code)] += 1
                if code == 200:
                    lat.append(time.perf_counter() - sent)
                    sent_at.append(sent - measure)
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - measure
    await client.aclose()
    row = _row("closed", clients, lat, status, elapsed)
    return {**row, "p99_local": local_tail(sent_at, lat)} if lat else row


def local_tail(sent_at: Sequence[float], lat: Sequence[float], window_s: float = 1.0) -> float:
    """p99 of each latency over the median latency of its ``window_s`` (by send time): the
    p99/p50 a machine whose speed drifts (other users' load) would show at a steady speed.
    Overtaking inside the server raises it; slow and fast seconds alone do not."""
    windows: Dict[int, List[float]] = {}
    for t, x in zip(sent_at, lat, strict=True):
        windows.setdefault(int(t // window_s), []).append(x)
    medians = {k: statistics.median(v) for k, v in windows.items()}
    return percentile([x / medians[int(t // window_s)]
                       for t, x in zip(sent_at, lat, strict=True)], 99)


def _demo_classifier(folder: Path, max_batch: int, delay_ms: float,
                     backend: str = "onnxruntime", **settings) -> Path:
    """Repository of the demo classifier's ONNX file (exported into the cache when missing)."""
    from serve.demo import demo_models
    cfg = demo_models("onnxruntime")[0]
    return write_repository(folder, [{"name": cfg.name, "path": cfg.path,
                                      "backend": backend, "max_batch_size": max_batch,
                                      "max_queue_delay_ms": delay_ms, "max_queue_size": 1024}],
                            **settings)


def png(size: int, index: int = 3) -> bytes:
    """One shapes image of ``size`` x ``size`` pixels, PNG encoded."""
    from irpe.data.shapes import render_classification
    buf = io.BytesIO()
    render_classification(7, index, size)[0].save(buf, "PNG")
    return buf.getvalue()


def _json_body() -> bytes:
    return json.dumps({"images": [base64.b64encode(png(64)).decode()]}).encode()


REQUESTS = ("v1", "v2-json", "v2-binary")


def request_of(kind: str, batch: int = 1) -> Tuple[str, bytes, Dict[str, str]]:
    """(path, body, headers) of one request: ``v1`` one JSON-base64 PNG; ``v2-json`` /
    ``v2-binary`` a [batch, 3, 64, 64] FP32 tensor (fixed pseudo-random normal values), as JSON
    data (Python's float repr, as tritonclient sends it) or as the binary-data extension."""
    if kind == "v1":
        return "/v1/classify?top_k=1", _json_body(), {"content-type": "application/json"}
    import numpy as np
    images = np.random.default_rng(0).standard_normal((batch, 3, 64, 64), dtype=np.float32)
    spec: Dict = {"name": "images", "shape": list(images.shape), "datatype": "FP32"}
    path = "/v2/models/deit_shapes_irpe/infer"
    if kind == "v2-json":
        body = json.dumps({"inputs": [{**spec, "data": images.reshape(-1).tolist()}]}).encode()
        return path, body, {"content-type": "application/json"}
    raw = images.tobytes()
    head = json.dumps({"inputs": [{**spec, "parameters": {"binary_data_size": len(raw)}}]})
    return path, head.encode() + raw, {"content-type": "application/octet-stream",
                                       "inference-header-content-length": str(len(head))}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_load", description=__doc__
                                .split("``python -m benchmarks.serve_load``: ")[1])
    p.add_argument("--concurrency", default="16,64", help="closed-loop client counts")
    p.add_argument("--duration", type=float, default=10.0, help="recorded seconds per level")
    p.add_argument("--warmup", type=float, default=2.0, help="unrecorded seconds per level")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every level and server")
    p.add_argument("--max-batch", type=int, default=8, help="server max_batch_size")
    p.add_argument("--delay-ms", type=float, default=5.0, help="server max_queue_delay_ms")
    p.add_argument("--threads", type=int, default=1, help="server --threads (onnxruntime)")
    p.add_argument("--baseline", type=Path, help="another checkout served side by side")
    p.add_argument("--gc-freeze-off", action="store_true", help="also serve this checkout with "
                   "gc_freeze: false, side by side (the setting's effect on the tail)")
    p.add_argument("--request", choices=REQUESTS, default="v1", help="v1: one JSON-base64 PNG "
                   "to /v1/classify; v2-json / v2-binary: FP32 tensors to /v2 infer")
    p.add_argument("--batch", type=int, default=1, help="images per v2 request")
    p.add_argument("--backend", choices=("onnxruntime", "openvino"), default="onnxruntime",
                   help="the served ONNX file's backend")
    p.add_argument("--out", type=Path, help="write every row as JSON here")
    return p


def _print_row(row: Dict) -> None:
    ratio = row["p99_ms"] / row["p50_ms"] if row.get("p50_ms") else float("nan")
    print(f"| {row['server']} | {row['round']} | {row['load']} | {row['images_per_s']:.0f} | "
          f"{row.get('p50_ms', float('nan')):.1f} | {row.get('p90_ms', float('nan')):.1f} | "
          f"{row.get('p99_ms', float('nan')):.1f} | {ratio:.2f} | "
          f"{row.get('p99_local', float('nan')):.2f} | {row['errors'] or '-'} | "
          f"{row['loadavg']:.1f} |", flush=True)


def _summary(rows: List[Dict], servers: Sequence[str]) -> None:
    print("\nmedian over rounds\n\n| server | clients | req/s | p50 ms | p99 ms | p99/p50 | "
          "p99/p50 (1 s) |\n|---|---|---|---|---|---|---|")
    for clients in sorted({r["load"] for r in rows}):
        for name in servers:
            own = [r for r in rows if r["server"] == name and r["load"] == clients
                   and "p50_ms" in r]
            if own:
                med = {k: statistics.median(r[k] for r in own) for k in
                       ("images_per_s", "p50_ms", "p99_ms")}
                ratio = statistics.median(r["p99_ms"] / r["p50_ms"] for r in own)
                local = statistics.median(r["p99_local"] for r in own)
                print(f"| {name} | {clients} | {med['images_per_s']:.0f} | {med['p50_ms']:.1f} "
                      f"| {med['p99_ms']:.1f} | {ratio:.2f} | {local:.2f} |")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Closed-loop p50/p99 per concurrency of `irpe serve` (and of ``--baseline``), alternated."""
    args = _parser().parse_args(argv)
    levels = int_list(args.concurrency)
    servers = {"this checkout": (None, {}),
               **({"baseline": (args.baseline, {})} if args.baseline else {}),
               **({"gc_freeze off": (None, {"gc_freeze": False})} if args.gc_freeze_off else {})}
    folder = Path(tempfile.mkdtemp(prefix="irpe-serve-load-"))
    path, body, headers = request_of(args.request, args.batch)
    rows: List[Dict] = []
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(server_process(
            _demo_classifier(folder / name.replace(" ", "_"), args.max_batch, args.delay_ms,
                             args.backend, **settings), args.threads, root=root))
            for name, (root, settings) in servers.items()}
        print(f"load average at start: {os.getloadavg()}\n\n| server | round | clients | "
              "req/s | p50 ms | p90 ms | p99 ms | p99/p50 | p99/p50 (1 s) | errors | load1 |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for rnd in range(1, args.rounds + 1):
            for clients in levels:
                for name, url in urls.items():
                    load = os.getloadavg()[0]
                    row = asyncio.run(lean_closed_loop(url, path, body, headers, clients,
                                                       args.duration, args.warmup))
                    rows.append({**row, "server": name, "round": rnd, "loadavg": load})
                    _print_row(rows[-1])
    _summary(rows, list(servers))
    print(f"\nload average at end: {os.getloadavg()}; server logs: {folder}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
