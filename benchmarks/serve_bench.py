"""`irpe bench serve`: HTTP throughput of `irpe serve` (child process) vs the same work in-process.

Models: ``tiny`` = the shapes classifier (64x64, bundled weights when present, else untrained;
~1 ms/image, so per-request HTTP work dominates) and ``deit_s`` = an untrained DeiT-S iRPE-K
classifier at 224x224 (compute dominates). Each is served alone by `irpe serve REPO.yaml` in its
own process (benchmarks.serve_load) while this process generates the load. In-process figures
(measured before the server starts, no server running):

- ``in-process``: PNG decode + the artifact's Preprocess + backend on batches of max_batch_size,
  one thread, sequential (the work a request does, minus HTTP, JSON and batching);
- ``backend``: backend.infer alone on full batches of zeros.

HTTP / in-process = best closed-loop img/s / ``in-process`` img/s.
"""
from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from benchmarks import serve_load

MODELS = {"tiny": ("deit_shapes_irpe", 64), "deit_s": (
    "deit_small_patch16_224_ctx_product_50_shared_k", 224)}


def weights(name: str, cache: Path) -> Path:
    """Bundled weights of ``name``, or an untrained model of that architecture."""
    from irpe.models.registry import bundled_weights, model_info
    try:
        return Path(bundled_weights(model_info(name)))
    except FileNotFoundError:
        return _untrained(name, cache / f"{name}_untrained.safetensors")


def _untrained(name: str, path: Path) -> Path:
    import torch
    from irpe.artifact import default_spec, save_trained
    from irpe.models import create_model
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        save_trained(create_model(name, num_classes=10).eval(), str(path),
                     default_spec(name, [f"c{i}" for i in range(10)], num_classes=10))
    return path


def model_config(name: str, backend: str, cache: Path, max_batch: int):
    """ModelConfig of a benchmarked model (exports ONNX once for onnxruntime)."""
    from serve.config import ModelConfig
    path = weights(name, cache)
    if backend == "onnxruntime":
        onnx = cache / f"{path.stem}.onnx"
        if not onnx.is_file():
            from export.onnx import export_onnx
            export_onnx(str(path), str(onnx))
        path = onnx
    return ModelConfig(name=name, path=path, backend=backend, max_batch_size=max_batch,
                       max_queue_size=1024)


def png(size: int, index: int = 3) -> bytes:
    """One shapes image of ``size`` x ``size`` pixels, PNG encoded."""
    from irpe.data.shapes import render_classification
    buf = io.BytesIO()
    render_classification(7, index, size)[0].save(buf, "PNG")
    return buf.getvalue()


def _rate(step: Callable[[], None], per_step: int, seconds: float) -> float:
    """Items/s of ``step`` (one warm-up call, then repeated for ``seconds``)."""
    step()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        count += per_step
    return count / (time.perf_counter() - start)


def in_process(cfg, threads: int, seconds: float, body: bytes) -> Dict[str, float]:
    """img/s of decode + Preprocess + backend, and of the backend alone, at max_batch_size."""
    import numpy as np
    from irpe.data.transforms import load_image
    from serve.backends import create_backend
    backend = create_backend(cfg, threads)
    backend.load()
    pre, n = backend.spec.transform(), cfg.max_batch_size
    zeros = np.zeros((n, 3, pre.size, pre.size), np.float32)

    def full() -> None:
        backend.infer(np.stack([pre(load_image(body)).numpy() for _ in range(n)]), None)
    try:
        return {"in-process": _rate(full, n, seconds),
                "backend": _rate(lambda: backend.infer(zeros, None), n, seconds)}
    finally:
        backend.close()


def _served(cfg) -> Dict:
    return cfg.model_dump(mode="json", include={"name", "path", "backend", "max_batch_size",
                                                "max_queue_size"})


def http_rows(cfg, settings: Dict, rate: float, body: bytes, folder: Path
              ) -> Tuple[List[Dict], Dict]:
    """Closed-loop sweep + open-loop run against `irpe serve` in a child process."""
    import httpx
    repo = serve_load.write_repository(folder / cfg.name, [_served(cfg)])
    url, seconds = f"/v1/models/{cfg.name}/classify?top_k=1", settings["duration_s"]
    rows = []
    with serve_load.server_process(repo, settings["threads"]) as base:
        for clients in _progress(settings["concurrency"], cfg.name):
            rows.append(asyncio.run(serve_load.closed_loop(base, url, clients, seconds, body)))
        rows.append(asyncio.run(serve_load.open_loop(base, url, rate, seconds, body)))
        hist = serve_load.batch_histogram(httpx.get(f"{base}/metrics").text, cfg.name)
    return rows, hist


def run_model(key: str, settings: Dict, cache: Path) -> Tuple[List[Dict], Dict]:
    """Rows (in-process, backend, closed..., open) of one model and its batch histogram."""
    name, size = MODELS[key]
    cfg = model_config(name, settings["backend"], cache, settings["max_batch_size"])
    body = png(size)
    inproc = in_process(cfg, settings["threads"], settings["duration_s"], body)
    rows = [{"mode": mode, "load": cfg.max_batch_size, "images_per_s": rate}
            for mode, rate in inproc.items()]
    http, hist = http_rows(cfg, settings, settings["rate"][key], body, cache / "repos")
    best = max(http[:-1], key=lambda r: r["images_per_s"])
    best["ratio_to_inprocess"] = best["images_per_s"] / inproc["in-process"]
    best["ratio_to_backend"] = best["images_per_s"] / inproc["backend"]
    return [{"model": key, **r} for r in rows + http], hist


def run(settings: Dict, cache: Path) -> Tuple[List[Dict], Dict[str, Dict[str, int]]]:
    """Every model of ``settings['models']``: rows and batch histograms by model."""
    results: List[Dict] = []
    hists: Dict[str, Dict[str, int]] = {}
    for key in settings["models"]:
        rows, hists[key] = run_model(key, settings, cache)
        results += rows
    return results, hists


def _progress(items, name: str):
    from tqdm import tqdm
    return tqdm(items, desc=f"bench serve {name}", unit="level")
