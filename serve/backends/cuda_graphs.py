"""CUDA graphs of a classifier at bucketed batch sizes (1, 2, 4, ... max): fewer kernel launches.

Each bucket has a static input buffer and one captured forward; a batch of b images is copied
into the smallest bucket >= b and the graph replayed (rows past b hold stale inputs; their
outputs are dropped: classification rows are independent). Capture needs CUDA; nothing here
runs on CPU (tests/gpu/test_serve_cuda.py and tests/gpu/test_gpu_defects.py check it).

Two rules make capture safe in a server:
- one capture at a time per process (``CAPTURE_LOCK``), each in ``thread_local`` error mode:
  instances load concurrently (serve.model), and under CUDA's default ``global`` mode another
  thread's cudaMalloc, synchronous copy or device sync during a capture fails that capture;
- a graph replays the raw addresses it captured, so each ``Captured`` keeps the tensors its
  forward read from the bucket-id cache (``irpe.idcache.BUCKET_IDS.holding``): an eviction from
  that LRU then cannot free memory a replay still reads.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import torch

from irpe.idcache import BUCKET_IDS

__all__ = ["CAPTURE_LOCK", "Captured", "GraphedClassifier", "buckets"]

CAPTURE_LOCK = threading.Lock()


def buckets(max_batch: int) -> List[int]:
    """Batch sizes with a graph: powers of two below ``max_batch``, and ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


@dataclass(frozen=True)
class Captured:
    """One bucket's graph with everything its replay reads or writes: the static input, the
    static output and the cached tensors (bucket ids) the forward read during capture."""

    graph: torch.cuda.CUDAGraph
    static: torch.Tensor
    out: torch.Tensor
    held: Tuple[torch.Tensor, ...]


class GraphedClassifier:
    """``forward(x) -> logits`` captured per bucket; other shapes run ``forward`` eagerly."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor],
                 item_shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 max_batch: int, warmup_calls: int = 3) -> None:
        self.forward, self.item_shape = forward, tuple(item_shape)
        self.device, self.warmup_calls = torch.device(device), warmup_calls
        self.graphs: Dict[int, Captured] = {}
        self.sizes = buckets(max_batch)  # ascending; __call__ picks the first that fits
        with CAPTURE_LOCK:
            self._prepare()
            for size in reversed(self.sizes):  # largest first: pool reuse
                static = torch.zeros((size, *self.item_shape), dtype=dtype, device=device)
                self._warm(static)
                with BUCKET_IDS.holding() as held:
                    graph, out = self._capture(static)
                self.graphs[size] = Captured(graph, static, out, tuple(held))
            self._finish()

    def _prepare(self) -> None:
        """The graphs' shared memory pool and the side stream of warm-up and capture."""
        self._pool = torch.cuda.graph_pool_handle()
        self._stream = torch.cuda.Stream(self.device)

    def _warm(self, static: torch.Tensor) -> None:
        """Eager calls before capture (allocator, autotuning, bucket ids cached)."""
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for _ in range(self.warmup_calls):
                self.forward(static)
        torch.cuda.current_stream(self.device).wait_stream(self._stream)

    def _capture(self, static: torch.Tensor) -> Tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture one forward on the side stream; other threads may use CUDA meanwhile."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                              capture_error_mode="thread_local"):
            out = self.forward(static)
        return graph, out

    def _finish(self) -> None:
        """Wait for the captures' side stream (not the whole device: other threads run)."""
        self._stream.synchronize()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x`` (B, *item_shape): replayed graph, or eager when no bucket fits."""
        size = next((s for s in self.sizes if s >= x.shape[0]), None)
        if size is None or tuple(x.shape[1:]) != self.item_shape:
            return self.forward(x)
        captured = self.graphs[size]
        captured.static[:x.shape[0]].copy_(x)
        captured.graph.replay()
        return captured.out[:x.shape[0]].clone()
