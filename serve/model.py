"""A served model: backend + batcher + the artifact's preprocessing; lifecycle and readiness."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from irpe.data.transforms import ImageError, Preprocess, load_image
from irpe.models import pad_images

from .backends import Backend, create_backend
from .batching import Batcher
from .config import ModelConfig
from .errors import ServeError, unavailable
from .metrics import Metrics

__all__ = ["ServedModel", "Prepared"]

log = logging.getLogger("irpe.serve")

Prepared = Tuple[np.ndarray, Tuple[int, int]]  # (3, H, W) float32 input, original (h, w)


class ServedModel:
    """One configured model; ``ready`` only after its backend loaded and ran a warmup batch."""

    def __init__(self, cfg: ModelConfig, metrics: Metrics, threads: int = 0) -> None:
        self.cfg, self.name = cfg, cfg.name
        self.backend: Backend = create_backend(cfg, threads)
        self.spec = self.backend.spec
        self.task = self.spec.task
        if cfg.task is not None and cfg.task != self.task:
            raise ValueError(f"model {cfg.name}: configured task {cfg.task} but {cfg.path} is "
                             f"a {self.task} model")
        self.labels = self._labels(cfg.class_names())
        self.preprocess: Preprocess = self.spec.transform()
        self.state, self.error = "loading", ""
        self.output_shapes: Dict[str, Tuple[int, ...]] = {}
        self.batcher = Batcher(cfg.name, self._run_batch, cfg.max_batch_size,
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
        """Start the worker, load the backend and warm it up, all in the inference thread."""
        self.batcher.start()
        try:
            await self.batcher.in_thread(self.backend.load)
            out = await self.batcher.in_thread(self.backend.warmup, *self._warmup_batch())
        except Exception as exc:  # a model that cannot load stays not-ready; others serve
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("model failed to load", extra={"model": self.name, "error": self.error})
            return
        self.output_shapes = {k: tuple(v.shape) for k, v in out.items()}
        self.state = "ready"
        log.info("model ready", extra={"model": self.name, "backend": self.cfg.backend,
                                       "task": self.task})

    async def stop(self) -> None:
        """Finish queued work, then release the backend."""
        if self.state == "ready":
            self.state = "stopping"
        await self.batcher.close()
        self.backend.close()

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
        """Decode and preprocess images (the artifact's Preprocess); runs in a worker thread."""
        out = []
        for i, blob in enumerate(blobs):
            try:
                image = load_image(blob)
            except ImageError as exc:
                raise ImageError(f"image {i}: {exc}" if len(blobs) > 1 else str(exc)) from None
            out.append((self.preprocess(image).numpy(), (image.height, image.width)))
        return out

    async def infer(self, images: Sequence[np.ndarray],
                    sizes: Optional[Sequence[Tuple[int, int]]] = None,
                    timeout_s: Optional[float] = None) -> List[Dict[str, np.ndarray]]:
        """Per-image model outputs through the batcher; ``sizes`` = valid (h, w) (detection)."""
        self.check_ready()
        if self.task == "classification":
            payloads, keys = [(im, None) for im in images], [im.shape for im in images]
        else:
            sizes = sizes or [im.shape[-2:] for im in images]
            payloads, keys = list(zip(images, sizes)), ["detection"] * len(images)
        return await self.batcher.submit(payloads, keys, timeout_s or self.cfg.timeout_s)

    def _run_batch(self, payloads: List[Tuple[np.ndarray, Optional[Tuple[int, int]]]]
                   ) -> List[Dict[str, np.ndarray]]:
        if self.task == "classification":
            out = self.backend.infer(np.stack([p[0] for p in payloads]), None)
        else:
            batch, _ = pad_images([torch.from_numpy(p[0]) for p in payloads])
            sizes = np.asarray([p[1] for p in payloads], dtype=np.int64)
            out = self.backend.infer(batch.numpy(), sizes)
        return [{k: v[i] for k, v in out.items()} for i in range(len(payloads))]

    def _warmup_batch(self) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        p = self.preprocess
        if self.task == "classification":
            return np.zeros((1, 3, p.size, p.size), np.float32), None
        return (np.zeros((1, 3, p.min_size, p.min_size), np.float32),
                np.asarray([[p.min_size, p.min_size]], np.int64))

    def describe(self) -> Dict:
        """Summary for listings (/v1/models)."""
        return {"name": self.name, "task": self.task, "backend": self.cfg.backend,
                "platform": self.backend.platform, "model": self.spec.model_name,
                "state": self.state, "num_classes": len(self.labels),
                "max_batch_size": self.cfg.max_batch_size}


def validate_count(count: int, limit: int) -> None:
    """400 for an empty request or more images than ``max_images``."""
    if count == 0:
        raise ServeError(400, "no image in the request")
    if count > limit:
        raise ServeError(400, f"{count} images in one request; the limit is {limit}")
