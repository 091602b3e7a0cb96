"""Image decode + resize for serving: a process-wide thread pool sized to the host, uint8 output.

Threads, not processes: PIL releases the GIL while decoding and resampling, and a thread returns
its array without pickling it (figures in docs/serve.md, "GPU serving"). Normalisation is not
done here: the uint8 (3, H, W) arrays go to the backend, which normalises them with
``irpe.data.transforms.normalize`` on its device (torch) or on the host (the others).
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from irpe.data.transforms import ImageError, Preprocess, load_image_for

__all__ = ["decode_u8", "decode_numbered", "host_workers", "set_decode_threads",
           "map_images_fifo"]

T = TypeVar("T")
_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None
_threads = 0  # the decode_threads setting (serve.config.ServeSettings); 0: host_workers()


def host_workers() -> int:
    """The CPUs this process may run on (the decode threads unless a setting names a number)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_decode_threads(threads: int) -> int:
    """Size the process-wide decode pool: ``threads`` (> 0) or :func:`host_workers` (0), from
    ``ServeSettings.decode_threads`` at app start; a pool of another size is replaced (its
    queued work still finishes). Returns the size."""
    global _pool, _threads
    if threads < 0:
        raise ValueError(f"decode threads must be >= 0, got {threads}")
    with _lock:
        _threads = threads
        old, size = _pool, threads or host_workers()
        if old is not None and old._max_workers != size:
            _pool = None
            old.shutdown(wait=False)
    return size


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_threads or host_workers(), thread_name_prefix="decode")
        return _pool


async def map_images_fifo(fn: Callable[[int, bytes], T], blobs: Sequence[bytes]) -> List[T]:
    """``[fn(i, blob)]`` in order, each image a task of the shared pool submitted from the event
    loop: every request's images join one FIFO queue served by as many threads as CPUs, so under
    load requests are decoded in the order they came (a pool per call, or more threads than CPUs
    racing for the GIL, let later requests overtake earlier ones: docs/serve.md, tail latency)."""
    loop, pool = asyncio.get_running_loop(), _shared_pool()
    return list(await asyncio.gather(*(loop.run_in_executor(pool, fn, i, blob)
                                       for i, blob in enumerate(blobs))))


def decode_numbered(preprocess: Preprocess, count: int, index: int, blob: bytes
                    ) -> Tuple[np.ndarray, Tuple[int, int]]:
    """:func:`decode_u8` of image ``index`` of a request of ``count`` images; an ImageError
    names the image when the request has several."""
    try:
        return decode_u8(blob, preprocess)
    except ImageError as exc:
        raise ImageError(f"image {index}: {exc}" if count > 1 else str(exc)) from None


def decode_u8(blob: bytes, preprocess: Preprocess) -> Tuple[np.ndarray, Tuple[int, int]]:
    """One encoded image -> (uint8 (3, H, W) model input before normalisation, original (h, w));
    large JPEGs are decoded reduced (draft mode) with the full decode's geometry."""
    image, (width, height) = load_image_for(blob, preprocess)
    pixels = np.asarray(preprocess.resized(image, (width, height)), dtype=np.uint8)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ImageError(f"expected an RGB image, got array shape {pixels.shape}")
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)), (height, width)
