"""`irpe bench serve`: asyncio + httpx load against a real uvicorn server on 127.0.0.1.

The server is the project's own (serve.testing.running_server -> serve.app.create_app) serving
the shapes classifier (bundled weights when present, else an untrained one of the same
architecture). Closed loop: N clients each send the next request when the last one returned.
Open loop: requests start at a fixed rate whatever the responses do. The in-process figure is
the backend alone at max_batch_size (no HTTP, no PNG decoding).
"""
from __future__ import annotations

import asyncio
import io
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

from benchmarks.report import latency_ms

MODEL = "deit_shapes_irpe"
URL = f"/v1/models/{MODEL}/classify?top_k=1"


def weights(cache: Path) -> Path:
    """The bundled classifier weights, or an untrained model of that architecture."""
    from irpe.models.registry import bundled_weights, model_info
    try:
        return Path(bundled_weights(model_info(MODEL)))
    except FileNotFoundError:
        return _untrained(cache / f"{MODEL}_untrained.safetensors")


def _untrained(path: Path) -> Path:
    import torch
    from irpe.artifact import default_spec, save_trained
    from irpe.data.shapes import SHAPE_CLASSES
    from irpe.models import create_model
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        save_trained(create_model(MODEL).eval(), str(path), default_spec(MODEL, list(SHAPE_CLASSES)))
    return path


def model_config(backend: str, cache: Path, max_batch: int):
    """ModelConfig of the benchmarked model (exports ONNX once for onnxruntime)."""
    from serve.config import ModelConfig
    path = weights(cache)
    if backend == "onnxruntime":
        onnx = cache / f"{path.stem}.onnx"
        if not onnx.is_file():
            from export.onnx import export_onnx
            export_onnx(str(path), onnx)
        path = onnx
    return ModelConfig(name=MODEL, path=path, backend=backend, max_batch_size=max_batch,
                       max_queue_size=1024)


def png(index: int = 3) -> bytes:
    """One 64x64 shapes image, PNG encoded."""
    from irpe.data.shapes import render_classification
    buf = io.BytesIO()
    render_classification(7, index, 64)[0].save(buf, "PNG")
    return buf.getvalue()


def in_process(cfg, threads: int, seconds: float) -> float:
    """Images/s of the backend alone on full batches of max_batch_size."""
    import numpy as np
    from serve.backends import create_backend
    backend = create_backend(cfg, threads)
    backend.load()
    batch = np.zeros((cfg.max_batch_size, 3, 64, 64), np.float32)
    backend.infer(batch, None)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        backend.infer(batch, None)
        count += cfg.max_batch_size
    rate = count / (time.perf_counter() - start)
    backend.close()
    return rate


async def _post(client, body: bytes, lat: List[float], status: Counter) -> None:
    start = time.perf_counter()
    try:
        r = await client.post(URL, content=body, headers={"content-type": "image/png"})
        status[str(r.status_code)] += 1
        if r.status_code == 200:
            lat.append(time.perf_counter() - start)
    except Exception as exc:  # connection errors count as errors, not crashes
        status[type(exc).__name__] += 1


async def closed_loop(base: str, clients: int, seconds: float, body: bytes) -> Dict:
    """``clients`` concurrent loops of request-after-response for ``seconds``."""
    import httpx
    lat: List[float] = []
    status: Counter = Counter()
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        deadline = time.perf_counter() + seconds

        async def worker():
            while time.perf_counter() < deadline:
                await _post(client, body, lat, status)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return _row("closed", clients, lat, status, elapsed)


async def open_loop(base: str, rate: float, seconds: float, body: bytes) -> Dict:
    """Requests started every 1/rate s for ``seconds`` (no waiting on responses)."""
    import httpx
    lat: List[float] = []
    status: Counter = Counter()
    async with httpx.AsyncClient(base_url=base, timeout=60,
                                 limits=httpx.Limits(max_connections=256)) as client:
        start, tasks = time.perf_counter(), []
        for i in range(max(1, int(rate * seconds))):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(_post(client, body, lat, status)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return _row("open", rate, lat, status, elapsed)


def _row(mode: str, load: float, lat: List[float], status: Counter, elapsed: float) -> Dict:
    errors = {k: v for k, v in status.items() if k != "200"}
    row = {"mode": mode, "load": load, "requests": sum(status.values()), "errors": errors,
           "images_per_s": len(lat) / elapsed, "seconds": elapsed}
    return row | (latency_ms(lat) if lat else {})


def batch_histogram(text: str) -> Dict[str, int]:
    """Batches per size bucket (non-cumulative) from the /metrics exposition text."""
    cumulative: List[Tuple[float, int]] = []
    for line in text.splitlines():
        if line.startswith("irpe_batch_size_bucket") and f'model="{MODEL}"' in line:
            le = line.split('le="')[1].split('"')[0]
            cumulative.append((float(le), int(float(line.rsplit(" ", 1)[1]))))
    cumulative.sort()
    out, prev = {}, 0
    for le, count in cumulative:
        out["inf" if le == float("inf") else str(int(le))] = count - prev
        prev = count
    return {k: v for k, v in out.items() if v}


def run(settings: Dict, cache: Path) -> Tuple[List[Dict], Dict[str, int]]:
    """In-process rate, then the closed-loop sweep and the open-loop run against one server."""
    import httpx
    from serve.config import ServeSettings
    from serve.testing import running_server
    cfg = model_config(settings["backend"], cache, settings["max_batch_size"])
    seconds = settings["duration_s"]
    inproc = in_process(cfg, settings["threads"], seconds)
    results = [{"mode": "in-process", "load": settings["max_batch_size"], "images_per_s": inproc}]
    body = png()
    server = ServeSettings(models=[cfg], threads=settings["threads"], log_level="warning")
    with running_server(server) as base:
        for clients in _progress(settings["concurrency"]):
            results.append(asyncio.run(closed_loop(base, clients, seconds, body)))
        results.append(asyncio.run(open_loop(base, settings["rate"], seconds, body)))
        hist = batch_histogram(httpx.get(f"{base}/metrics").text)
    best = max(r["images_per_s"] for r in results if r["mode"] == "closed")
    for r in results:
        if r["mode"] == "closed" and r["images_per_s"] == best:
            r["ratio_to_inprocess"] = best / inproc
    return results, hist


def _progress(items):
    from tqdm import tqdm
    return tqdm(items, desc="bench serve", unit="level")
