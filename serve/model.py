"""A served model: backend instances + batcher + the artifact's preprocessing; lifecycle,
readiness, and the one pass of a request once it is found ready (serve.state.get_model): its
image count checked, its queue room held (serve.batching), its images decoded
(serve.preprocess_pool, or nvJPEG) to uint8 model inputs, then batched. The backend normalises
(irpe.data.transforms.normalize, on its device for torch). /v1 and /v2 share that pass."""
from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import asdict
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union, cast

import numpy as np
import torch

from irpe.data.transforms import Preprocess
from irpe.errors import InvalidInput
from irpe.models import pad_images

from .backends import Backend, create_backend
from .batching import Batcher
from .config import ModelConfig, ServeSettings
from .errors import ServeError, unavailable
from .gc_freeze import freeze_loaded, thaw
from .memory import Footprint, measure
from .metrics import Metrics
from .nvjpeg import available as nvjpeg_available
from .nvjpeg import decode_on_device
from .preprocess_pool import decode_numbered, map_images_fifo
from .tracing import span

__all__ = ["ServedModel", "Input", "check_count"]

log = logging.getLogger("irpe.serve")


class Input(NamedTuple):
    """One image of a request as the batcher carries it."""

    image: Union[np.ndarray, torch.Tensor]  # (3, H, W): uint8 decoded, or float32 (v2)
    original: Optional[Tuple[int, int]] = None  # decoded: (h, w) before resizing (REST boxes)
    size: Optional[Tuple[int, int]] = None  # detection: valid (h, w); None: the whole image


class ServedModel:
    """One configured model; ``ready`` only after every instance loaded and ran a warmup batch."""

    def __init__(self, cfg: ModelConfig, metrics: Metrics, threads: int = 0,
                 max_images: int = ServeSettings.model_fields["max_images"].default,
                 gc_freeze: bool = False) -> None:
        self.cfg, self.name, self.max_images, self.metrics = cfg, cfg.name, max_images, metrics
        self.gc_freeze = gc_freeze  # serve.gc_freeze once loaded (ServeSettings.gc_freeze)
        self.backends: List[Backend] = [create_backend(cfg, threads)
                                        for _ in range(cfg.instances)]
        self.backend = self.backends[0]
        self.spec = self.backend.spec
        self.task = self.spec.task
        if cfg.task is not None and cfg.task != self.task:
            raise InvalidInput(f"model {cfg.name}: configured task {cfg.task} but {cfg.path} is "
                               f"a {self.task} model")
        self.labels = self._labels(cfg.class_names())
        self.preprocess: Preprocess = self.spec.transform()
        self.gpu_decode = cfg.gpu_decode and cfg.backend == "torch" and \
            nvjpeg_available(cfg.device)
        self.state, self.error = "loading", ""
        self.output_shapes: Dict[str, Tuple[int, ...]] = {}
        self.instance_batches = [0] * cfg.instances  # batches run by each instance
        self.footprints = [Footprint()] * cfg.instances  # each instance's load + warm-up
        runs = [functools.partial(self._run_batch, i) for i in range(cfg.instances)]
        self.batcher = Batcher(cfg.name, runs, self._batch_key, cfg.max_batch_size,
                               cfg.max_queue_delay_ms / 1000.0, cfg.max_queue_size, metrics)

    def _labels(self, configured: Optional[List[str]]) -> List[str]:
        names = list(self.spec.class_names)
        if configured is None:
            return names
        if len(configured) != len(names):
            raise InvalidInput(f"model {self.name}: {len(configured)} labels configured for a "
                               f"model with {len(names)} classes")
        return list(configured)

    @property
    def precision(self) -> str:
        """What the model computes in, the one source of /v1/models and the "model ready" log
        line: an ONNX file's own precision (int8 when quantised), else the configured one."""
        return self.backend.file_precision or self.cfg.run_precision()

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
        frozen = freeze_loaded() if self.gc_freeze else 0
        self.batcher.span_attributes = {"irpe.model": self.name, "irpe.backend": self.cfg.backend,
                                        "irpe.precision": self.precision,
                                        "irpe.device": self.cfg.device}
        self.state = "ready"
        self.metrics.model_memory(self.name, self.memory)
        log.info("model ready", extra={"model": self.name, "backend": self.cfg.backend,
                                       "task": self.task, "instances": len(self.backends),
                                       "precision": self.precision,
                                       "frozen_objects": frozen})

    async def _start_instance(self, i: int) -> Dict[str, np.ndarray]:
        return await self.batcher.in_thread(self._load_instance, i, instance=i)

    def _load_instance(self, i: int) -> Dict[str, np.ndarray]:
        """Load and warm up instance ``i`` in its inference thread, its memory growth measured
        with no other load beside it (serve.memory)."""
        backend = self.backends[i]
        with measure(self.cfg.backend, self.cfg.device,
                     functools.partial(self.footprints.__setitem__, i)):
            backend.load()
            return backend.warmup(*self._warmup_batch())

    @property
    def memory(self) -> Footprint:
        """What the model's instances hold once loaded and warmed up (serve.memory)."""
        total = self.footprints[0]
        for other in self.footprints[1:]:
            total = total.add(other)
        return total

    async def stop(self) -> None:
        """Finish queued work, then release the backend."""
        if self.state == "ready":
            self.state = "stopping"
        await self.batcher.close()
        for backend in self.backends:
            backend.close()
        if self.gc_freeze:
            thaw()

    def check_ready(self) -> None:
        """503 unless ready (with the load error when loading failed)."""
        if self.state == "failed":
            raise unavailable(f"model {self.name} failed to load: {self.error}", 30)
        if not self.ready:
            raise unavailable(f"model {self.name} is {self.state}", 5)

    def shed(self) -> None:
        """/v2, before its body is parsed (the image count is inside it): 503 when the queue
        has no room for one image, so an overloaded server parses no tensors it refuses."""
        self.batcher.refuse_if_full(1)

    async def infer_images(self, blobs: Sequence[bytes]
                           ) -> Tuple[List[Input], List[Dict[str, np.ndarray]]]:
        """/v1: encoded images -> (decoded inputs, per-image outputs). The count is checked and
        the queue room held before any decoding (400 / 503); ImageError for a bad image."""
        check_count(len(blobs), self.max_images, self.cfg.max_queue_size, self.name)
        return await self.batcher.submit(len(blobs), functools.partial(self.decode, blobs),
                                         self.cfg.timeout_s)

    async def infer(self, images: Sequence[np.ndarray],
                    sizes: Optional[Sequence[Tuple[int, int]]] = None,
                    timeout_s: Optional[float] = None) -> List[Dict[str, np.ndarray]]:
        """/v2: model inputs (float32 (3, H, W); ``sizes`` = valid (h, w), detection) ->
        per-image outputs, through the same count check and queue."""
        check_count(len(images), self.max_images, self.cfg.max_queue_size, self.name)
        inputs = [Input(im, size=None if sizes is None
                        else cast("Tuple[int, int]", tuple(sizes[i])))
                  for i, im in enumerate(images)]
        return (await self.batcher.submit(len(inputs), functools.partial(_given, inputs),
                                          timeout_s or self.cfg.timeout_s))[1]

    async def decode(self, blobs: Sequence[bytes]) -> List[Input]:
        """Decode and resize a request's images (the artifact's Preprocess, minus normalisation)
        to uint8: JPEGs on the GPU (serve.nvjpeg, in a worker thread) on CUDA with torchvision;
        otherwise, or when one image is not a plain JPEG, each image a task of the shared FIFO
        decode pool (requests are not overtaken in a pool of their own); traced: ``decode``."""
        with span("decode"):
            if self.gpu_decode:
                on_device = await asyncio.to_thread(decode_on_device, blobs, self.preprocess,
                                                    self.cfg.device)
                if on_device is not None:
                    return [Input(*d) for d in on_device]
            decode = functools.partial(decode_numbered, self.preprocess, len(blobs))
            return [Input(*d) for d in await map_images_fifo(decode, blobs)]

    def _batch_key(self, item: Input) -> Tuple:
        """Classification batches images of one shape and dtype (uint8 decoded and float v2
        apart); detection pads, so only the dtype separates batches."""
        if self.task == "classification":
            return tuple(item.image.shape), str(item.image.dtype)
        return "detection", str(item.image.dtype)

    def _run_batch(self, instance: int, inputs: List[Input]) -> List[Dict[str, np.ndarray]]:
        backend, sizes, images = self.backends[instance], None, [i.image for i in inputs]
        if isinstance(images[0], torch.Tensor):  # uint8 decoded on the GPU (nvjpeg)
            tensors = cast("List[torch.Tensor]", images)  # a batch is decoded one way
            batch = torch.stack(tensors) if self.task == "classification" \
                else pad_images(tensors)[0]
        elif self.task == "classification":
            batch = np.stack(images)
        else:
            batch = pad_images([torch.from_numpy(im) for im in images])[0].numpy()
        if self.task != "classification":
            sizes = np.asarray([i.size or tuple(i.image.shape[-2:]) for i in inputs], np.int64)
        uint8 = batch.dtype == (torch.uint8 if isinstance(batch, torch.Tensor) else np.uint8)
        infer = backend.infer_uint8 if uint8 else backend.infer
        # a tensor batch (gpu_decode) only reaches the torch backend, whose infer_uint8 takes it
        out = infer(cast("np.ndarray", batch), sizes)
        self.instance_batches[instance] += 1
        return [{k: v[i] for k, v in out.items()} for i in range(len(inputs))]

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
                "precision": self.precision, "memory": asdict(self.memory)}


async def _given(inputs: List[Input]) -> List[Input]:
    """Inputs that are ready already (v2 tensors), as the batcher's awaitable."""
    return inputs


def check_count(count: int, max_images: int, max_queue_size: int, model: str) -> None:
    """The image-count rules of a request, in one place: 400 for none, for more than the
    server's ``max_images``, or for more than the model's queue can ever hold."""
    if count == 0:
        raise ServeError(400, "no image in the request")
    if count > max_images:
        raise ServeError(400, f"{count} images in one request; the limit is {max_images}")
    if count > max_queue_size:
        raise ServeError(400, f"{count} images in one request; model {model} "
                         f"queues at most {max_queue_size}")
