"""CUDA graphs of a classifier at bucketed batch sizes (1, 2, 4, ... max): fewer kernel launches.

Each bucket has a static input buffer and one captured forward; a batch of b images is copied
into the smallest bucket >= b and the graph replayed (rows past b hold stale inputs; their
outputs are dropped: classification rows are independent). Capture needs CUDA; nothing here
runs on CPU (tests/gpu/test_serve_cuda.py checks it).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch

__all__ = ["GraphedClassifier", "buckets"]


def buckets(max_batch: int) -> List[int]:
    """Batch sizes with a graph: powers of two below ``max_batch``, and ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


class GraphedClassifier:
    """``forward(x) -> logits`` captured per bucket; other shapes run ``forward`` eagerly."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor],
                 item_shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 max_batch: int, warmup_calls: int = 3) -> None:
        self.forward, self.item_shape = forward, tuple(item_shape)
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.sizes = buckets(max_batch)  # ascending; __call__ picks the first that fits
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        for size in reversed(self.sizes):  # largest first: pool reuse
            static = torch.zeros((size, *self.item_shape), dtype=dtype, device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):  # warm-up outside capture (allocator, autotune)
                for _ in range(warmup_calls):
                    forward(static)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = forward(static)
            self.graphs[size] = (graph, static, out)
        torch.cuda.synchronize(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x`` (B, *item_shape): replayed graph, or eager when no bucket fits."""
        size = next((s for s in self.sizes if s >= x.shape[0]), None)
        if size is None or tuple(x.shape[1:]) != self.item_shape:
            return self.forward(x)
        graph, static, out = self.graphs[size]
        static[:x.shape[0]].copy_(x)
        graph.replay()
        return out[:x.shape[0]].clone()
