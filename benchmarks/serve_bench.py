"""`irpe bench serve`: HTTP throughput of `irpe serve` (child process) vs the same work in-process.

Models: ``tiny`` = the shapes classifier (64x64, bundled weights when present, else untrained;
~1 ms/image, so per-request HTTP work dominates) and ``deit_s`` = an untrained DeiT-S iRPE-K
classifier at 224x224 (compute dominates). Each is served alone by `irpe serve REPO.yaml` in its
own process (benchmarks.serve_load) while this process generates the load. In-process figures
(measured before the server starts, no server running):

- ``in-process``: the server's own decode (serve.preprocess_pool.decode_u8: decode, draft,
  resize to uint8) + backend.infer_uint8 (normalisation on the device) on batches of
  max_batch_size, one thread, sequential (the work a request does, minus HTTP and batching);
- ``backend``: backend.infer alone on full batches of zeros (the model alone).

HTTP / in-process = best closed-loop img/s / ``in-process`` img/s. Images: the shapes PNG
(default on CPU, as the landed figures) or a 451x300 photo-like JPEG (default on CUDA); each
closed-loop level runs with 1 (and, by default on CUDA, 8) images per request (multipart).
"""
from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import time
import uuid
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

    from irpe.artifact.trained import default_spec, save_trained
    from irpe.models import create_model
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        save_trained(create_model(name, num_classes=10).eval(), str(path),
                     default_spec(name, [f"c{i}" for i in range(10)], num_classes=10))
    return path


def model_config(name: str, backend: str, cache: Path, max_batch: int, **runtime):
    """ModelConfig of a benchmarked model (onnxruntime, openvino: the cached export of
    onnx_file; precision int8: that export quantised for OpenVINO, int8_ir); ``runtime``:
    device, precision, instances, cuda_graphs."""
    from serve.config import ModelConfig
    path = weights(name, cache)
    if backend in ("onnxruntime", "openvino"):
        path = onnx_file(path, cache)
    if runtime.get("precision") == "int8":
        path, runtime = int8_ir(path), dict(runtime, precision=None)
    return ModelConfig(name=name, path=path, backend=backend, max_batch_size=max_batch,
                       max_queue_size=1024, **{k: v for k, v in runtime.items() if v is not None})


def onnx_file(weights: Path, cache: Path) -> Path:
    """The ONNX export of ``weights`` under ``cache``/onnx, exported when missing; named by
    serve's demo cache key (digest of the weights file and of the irpe/ + export/ sources), so
    changed weights, spec, model or exporter code never reuse a stale file."""
    from irpe.artifact.exporters import get_exporter
    from serve.demo import onnx_cache_path
    exporter = get_exporter("onnx")
    onnx = onnx_cache_path(weights, cache, exporter)
    if not onnx.is_file():
        onnx.parent.mkdir(parents=True, exist_ok=True)
        exporter.write(str(weights), onnx)
    return onnx


def int8_ir(onnx: Path) -> Path:
    """``onnx`` quantised by ``irpe quantize --target openvino`` (NNCF, 64 shapes images) beside
    it, made when missing or older (with the iRPE OpenVINO library where it is built, as the
    server then reads it)."""
    ir = onnx.with_suffix(".int8.xml")
    if not ir.is_file() or ir.stat().st_mtime < onnx.stat().st_mtime:
        subprocess.run([sys.executable, "-m", "irpe", "quantize", str(onnx), "-o", str(ir),
                        "--target", "openvino", "--calibration", "shapes", "--samples", "64"],
                       check=True, stdout=subprocess.DEVNULL)
    return ir


def jpeg(width: int = 451, height: int = 300) -> bytes:
    """A photo-like JPEG (smooth colour gradients + mild noise), quality 90."""
    import numpy as np
    from PIL import Image
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(np.sin(x / 37) + np.cos(y / 23)) * 60 + 128, x * 255 / width,
                    y * 255 / height], -1)
    noise = np.random.default_rng(0).normal(0, 12, rgb.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(rgb + noise, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def request_body(image: bytes, count: int, media: str) -> Tuple[bytes, str]:
    """(body, content type): the raw image for one, a multipart form of ``count`` files else."""
    if count == 1:
        return image, media
    boundary = uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"i\"\r\nContent-Type: {media}\r\n\r\n")
    part = head.encode() + image + b"\r\n"
    return part * count + f"--{boundary}--\r\n".encode(), \
        f"multipart/form-data; boundary={boundary}"


def _rate(step: Callable[[], None], per_step: int, seconds: float) -> float:
    """Items/s of ``step`` (one warm-up call, then repeated for ``seconds``)."""
    step()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        count += per_step
    return count / (time.perf_counter() - start)


def in_process(cfg, threads: int, seconds: float, body: bytes) -> Dict[str, float]:
    """img/s of the server's decode + backend, and of the backend alone, at max_batch_size."""
    import numpy as np

    from serve.backends import create_backend
    from serve.preprocess_pool import decode_u8
    backend = create_backend(cfg, threads)
    backend.load()
    pre, n = backend.spec.transform(), cfg.max_batch_size
    zeros = np.zeros((n, 3, pre.size, pre.size), np.float32)
    backend.warmup(zeros[:1], None)  # the server's warmup (fp16/bf16: checked vs fp32)

    def full() -> None:
        backend.infer_uint8(np.stack([decode_u8(body, pre)[0] for _ in range(n)]), None)
    try:
        return {"in-process": _rate(full, n, seconds),
                "backend": _rate(lambda: backend.infer(zeros, None), n, seconds)}
    finally:
        backend.close()


def _served(cfg) -> Dict:
    return cfg.model_dump(mode="json", exclude_none=True, include={
        "name", "path", "backend", "max_batch_size", "max_queue_size", "device", "precision",
        "instances", "cuda_graphs"})


def http_rows(cfg, settings: Dict, rate: float, image: Tuple[bytes, str], folder: Path
              ) -> Tuple[List[Dict], Dict]:
    """Closed-loop sweep (per images-per-request count) + open-loop run (one image per
    request) against `irpe serve` in a child process; img/s counts images, not requests."""
    import httpx
    repo = serve_load.write_repository(folder / cfg.name, [_served(cfg)])
    url, seconds = f"/v1/models/{cfg.name}/classify?top_k=1", settings["duration_s"]
    rows = []
    with serve_load.server_process(repo, settings["threads"]) as base:
        for count, clients in _progress(_levels(settings), cfg.name):
            body, ctype = request_body(image[0], count, image[1])
            row = asyncio.run(serve_load.closed_loop(base, url, clients, seconds, body, ctype))
            rows.append(_per_image(row, count))
        rows.append(_per_image(asyncio.run(serve_load.open_loop(
            base, url, rate, seconds, image[0], image[1])), 1))
        hist = serve_load.batch_histogram(httpx.get(f"{base}/metrics").text, cfg.name)
    return rows, hist


def _levels(settings: Dict) -> List[Tuple[int, int]]:
    """(images per request, clients) of every closed-loop level."""
    return [(n, c) for n in settings.get("images_per_request", [1])
            for c in settings["concurrency"]]


def _per_image(row: Dict, count: int) -> Dict:
    """A load row with img/s counting ``count`` images per answered request (mode "closed x8"
    for 8 images per request, so the Markdown table tells the levels apart)."""
    mode = row["mode"] if count == 1 else f"{row['mode']} x{count}"
    return {**row, "mode": mode, "images_per_request": count,
            "images_per_s": row["images_per_s"] * count}


def run_model(key: str, settings: Dict, cache: Path) -> Tuple[List[Dict], Dict]:
    """Rows (in-process, backend, closed..., open) of one model and its batch histogram."""
    name, size = MODELS[key]
    runtime = {k: settings.get(k) for k in ("device", "precision", "instances", "cuda_graphs")}
    cfg = model_config(name, settings["backend"], cache, settings["max_batch_size"], **runtime)
    image = ((jpeg(), "image/jpeg") if settings.get("image") == "jpeg"
             else (serve_load.png(size), "image/png"))
    inproc = in_process(cfg, settings["threads"], settings["duration_s"], image[0])
    rows = [{"mode": mode, "load": cfg.max_batch_size, "images_per_s": rate}
            for mode, rate in inproc.items()]
    http, hist = http_rows(cfg, settings, settings["rate"][key], image, cache / "repos")
    for count in sorted({r["images_per_request"] for r in http[:-1]}):
        best = max((r for r in http[:-1] if r["images_per_request"] == count),
                   key=lambda r: r["images_per_s"])
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
