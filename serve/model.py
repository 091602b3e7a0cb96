"""A served model: backend instances + batcher + the artifact's preprocessing; lifecycle and
readiness. Images are decoded (serve.preprocess_pool) to uint8 model inputs; the backend
normalises them (on its device for torch)."""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from irpe.data.transforms import Preprocess
from irpe.models import pad_images

from .backends import Backend, create_backend
from .batching import Batcher
from .config import ModelConfig
from .errors import ServeError, unavailable
from .metrics import Metrics
from .preprocess_pool import decode_numbered, map_images, map_images_fifo

__all__ = ["ServedModel", "Prepared"]

log = logging.getLogger("irpe.serve")

Prepared = Tuple[np.ndarray, Tuple[int, int]]  # (3, H, W) uint8 input, original (h, w)


class ServedModel:
    """One configured model; ``ready`` only after every instance loaded and ran a warmup batch."""

    def __init__(self, cfg: ModelConfig, metrics: Metrics, threads: int = 0) -> None:
        self.cfg, self.name = cfg, cfg.name
        self.backends: List[Backend] = [create_backend(cfg, threads)
                                        for _ in range(cfg.instances)]
        self.backend = self.backends[0]
        self.spec = self.backend.spec
        self.task = self.spec.task
        if cfg.task is not None and cfg.task != self.task:
            raise ValueError(f"model {cfg.name}: configured task {cfg.task} but {cfg.path} is "
                             f"a {self.task} model")
        self.labels = self._labels(cfg.class_names())
        self.preprocess: Preprocess = self.spec.transform()
        self.gpu_decode = cfg.gpu_decode and cfg.backend == "torch" and _nvjpeg(cfg.device)
        self.state, self.error = "loading", ""
        self.output_shapes: Dict[str, Tuple[int, ...]] = {}
        self.instance_batches = [0] * cfg.instances  # batches run by each instance
        runs = [functools.partial(self._run_batch, i) for i in range(cfg.instances)]
        self.batcher = Batcher(cfg.name, runs, cfg.max_batch_size,
                               cfg.max_queue_delay_ms / 1000.0, cfg.max_queue_size, metrics)

    def _labels(self, configured: Optional[List[str]]) -> List[str]:
        names = list(self.spec.class_names)
        if configured is None:
            return names
        if len(configured) != len(names):
            raise ValueError(f"model {self.name}: {len(configured)} labels configured for a "
                             f"model with {len(names)} classes")
        return list(configured)

    @property
    def ready(self) -> bool:
        """True once loaded and warmed up (and not shutting down)."""
        return self.state == "ready"

    async def start(self) -> None:
        """Start the workers; load and warm up every instance in its own inference thread."""
        self.batcher.start()
        try:
            outs = await asyncio.gather(*(self._start_instance(i)
                                          for i in range(len(self.backends))))
            out = outs[0]
        except Exception as exc:  # a model that cannot load stays not-ready; others serve
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("model failed to load", extra={"model": self.name, "error": self.error})
            return
        self.output_shapes = {k: tuple(v.shape) for k, v in out.items()}
        self.state = "ready"
        log.info("model ready", extra={"model": self.name, "backend": self.cfg.backend,
                                       "task": self.task, "instances": len(self.backends),
                                       "precision": self.cfg.run_precision()})

    async def _start_instance(self, i: int) -> Dict[str, np.ndarray]:
        backend = self.backends[i]
        await self.batcher.in_thread(backend.load, instance=i)
        return await self.batcher.in_thread(backend.warmup, *self._warmup_batch(), instance=i)

    async def stop(self) -> None:
        """Finish queued work, then release the backend."""
        if self.state == "ready":
            self.state = "stopping"
        await self.batcher.close()
        for backend in self.backends:
            backend.close()

    def check_ready(self) -> None:
        """503 unless ready (with the load error when loading failed)."""
        if self.state == "failed":
            raise unavailable(f"model {self.name} failed to load: {self.error}", 30)
        if not self.ready:
            raise unavailable(f"model {self.name} is {self.state}", 5)

    def admit(self, count: int = 1) -> None:
        """Cheap load shedding before any decoding: 503 unless ready with queue room."""
        self.check_ready()
        self.batcher.check_room(count)

    def prepare(self, blobs: Sequence[bytes]) -> List[Prepared]:
        """Decode and resize images (the artifact's Preprocess, minus normalisation) to uint8;
        several images of one request decode in the host-sized pool; on CUDA with torchvision,
        JPEGs decode on the GPU (serve.nvjpeg) instead. Runs in a worker thread."""
        if self.gpu_decode:
            from .nvjpeg import decode_on_device
            on_device = decode_on_device(blobs, self.preprocess, self.cfg.device)
            if on_device is not None:
                return on_device
        return map_images(functools.partial(decode_numbered, self.preprocess, len(blobs)), blobs)

    async def decode(self, blobs: Sequence[bytes]) -> List[Prepared]:
        """:meth:`prepare` for a request, from the event loop: on the CPU each image is a task
        of the shared FIFO decode pool (requests are not overtaken in a pool of their own)."""
        if self.gpu_decode:
            return await asyncio.to_thread(self.prepare, blobs)
        return await map_images_fifo(functools.partial(decode_numbered, self.preprocess,
                                                       len(blobs)), blobs)

    async def infer(self, images: Sequence[np.ndarray],
                    sizes: Optional[Sequence[Tuple[int, int]]] = None,
                    timeout_s: Optional[float] = None) -> List[Dict[str, np.ndarray]]:
        """Per-image model outputs through the batcher; ``sizes`` = valid (h, w) (detection)."""
        self.check_ready()
        if self.task == "classification":  # uint8 (decoded) and float (v2) batch apart
            payloads = [(im, None) for im in images]
            keys = [(tuple(im.shape), str(im.dtype)) for im in images]
        else:
            sizes = sizes or [im.shape[-2:] for im in images]
            payloads = list(zip(images, sizes))
            keys = [("detection", str(im.dtype)) for im in images]
        return await self.batcher.submit(payloads, keys, timeout_s or self.cfg.timeout_s)

    def _run_batch(self, instance: int,
                   payloads: List[Tuple[np.ndarray, Optional[Tuple[int, int]]]]
                   ) -> List[Dict[str, np.ndarray]]:
        backend, sizes = self.backends[instance], None
        if isinstance(payloads[0][0], torch.Tensor):  # uint8 decoded on the GPU (nvjpeg)
            batch = torch.stack([p[0] for p in payloads]) if self.task == "classification" \
                else pad_images([p[0] for p in payloads])[0]
        elif self.task == "classification":
            batch = np.stack([p[0] for p in payloads])
        else:
            batch = pad_images([torch.from_numpy(p[0]) for p in payloads])[0].numpy()
        if self.task != "classification":
            sizes = np.asarray([tuple(p[1]) for p in payloads], dtype=np.int64)
        uint8 = batch.dtype == (torch.uint8 if isinstance(batch, torch.Tensor) else np.uint8)
        infer = backend.infer_uint8 if uint8 else backend.infer
        out = infer(batch, sizes)
        self.instance_batches[instance] += 1
        return [{k: v[i] for k, v in out.items()} for i in range(len(payloads))]

    def _warmup_batch(self) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """A fixed pseudo-random batch of one image (the fp16/bf16 check compares on it)."""
        p, rng = self.preprocess, np.random.default_rng(0)
        side = p.size if self.task == "classification" else p.min_size
        images = rng.standard_normal((1, 3, side, side), dtype=np.float32)
        sizes = None if self.task == "classification" else np.asarray([[side, side]], np.int64)
        return images, sizes

    def describe(self) -> Dict:
        """Summary for listings (/v1/models)."""
        return {"name": self.name, "task": self.task, "backend": self.cfg.backend,
                "platform": self.backend.platform, "model": self.spec.model_name,
                "state": self.state, "num_classes": len(self.labels),
                "max_batch_size": self.cfg.max_batch_size, "instances": len(self.backends),
                "precision": getattr(self.backend, "file_precision", None)
                or self.cfg.run_precision()}


def _nvjpeg(device: str) -> bool:
    from .nvjpeg import available
    return available(device)


def validate_count(count: int, limit: int) -> None:
    """400 for an empty request or more images than ``max_images``."""
    if count == 0:
        raise ServeError(400, "no image in the request")
    if count > limit:
        raise ServeError(400, f"{count} images in one request; the limit is {limit}")
