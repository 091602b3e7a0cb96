"""The process-wide cache of bucket-id tensors, bounded by bytes (least recently used first out).

Bucket ids are (L, L) int64 per grid size, per device: 8.8 MB for DETR's 25x42 grid at
800x1333; the fused attention's int32 id tables (irpe.fused.dispatch) are kept here too. A
server fed images of many sizes would keep every grid it ever saw, so the cache holds at most
``IRPE_BUCKET_CACHE_MIB`` MiB (default 64; 0 disables caching) and drops the least recently
used grids first. Serving shows its size as the ``irpe_bucket_cache_bytes`` gauge.
A CUDA graph captured while reading cached ids replays their raw addresses: its owner takes the
tensors from ``TensorLRU.holding`` so an eviction cannot free memory the graph still reads.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections import OrderedDict
from typing import Callable, Hashable, Iterator, List, Optional

import torch

__all__ = ["TensorLRU", "BUCKET_IDS", "DEFAULT_MIB", "limit_from_env"]

DEFAULT_MIB = 64
ENV = "IRPE_BUCKET_CACHE_MIB"


def limit_from_env() -> int:
    """Byte limit from ``$IRPE_BUCKET_CACHE_MIB`` (MiB, >= 0); the default, with a warning,
    when it is not a number (an import must not fail on a bad variable)."""
    text = os.environ.get(ENV, "").strip()
    try:
        mib = float(text) if text else DEFAULT_MIB
        if not mib >= 0:
            raise ValueError
    except ValueError:
        warnings.warn(f"{ENV}={text!r} is not a number of MiB >= 0; using {DEFAULT_MIB}",
                      stacklevel=2)
        mib = DEFAULT_MIB
    return int(mib * (1 << 20))


class TensorLRU:
    """Tensors by key, at most ``max_bytes`` in total; thread-safe (one inference thread per
    served model). A tensor larger than the whole limit is returned but not kept."""

    def __init__(self, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self._items: "OrderedDict[Hashable, torch.Tensor]" = OrderedDict()
        self._bytes = 0
        self._holders = threading.local()  # per thread: the lists open ``holding`` blocks fill
        self.max_bytes = max_bytes
        self.hits = self.misses = self.evictions = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get_or_build(self, key: Hashable, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The cached tensor of ``key``, or ``build()`` stored under it (evicting old ones)."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return self._hold(found)
            self.misses += 1
        tensor = build()  # outside the lock: building a large grid takes milliseconds
        with self._lock:
            if key not in self._items:
                self._put(key, tensor)
            return self._hold(self._items.get(key, tensor))

    @contextlib.contextmanager
    def holding(self) -> Iterator[List[torch.Tensor]]:
        """Yield a list that receives every tensor this thread gets from ``get_or_build`` in
        the block (each once): references for an owner whose work reads their memory after
        the cache may have dropped them (a captured CUDA graph replays raw pointers)."""
        stack = self._holders.__dict__.setdefault("stack", [])
        held: List[torch.Tensor] = []
        stack.append(held)
        try:
            yield held
        finally:
            stack.pop()  # blocks nest, so this one is the innermost

    def _hold(self, tensor: torch.Tensor) -> torch.Tensor:
        for held in getattr(self._holders, "stack", ()):
            if not any(t is tensor for t in held):
                held.append(tensor)
        return tensor

    def peek(self, key: Hashable) -> Optional[torch.Tensor]:
        """The cached tensor of ``key`` or None, without lock or bookkeeping: a plain dict
        read that torch.compile can trace (a cold key is then built in the graph)."""
        return self._items.get(key)

    def set_limit(self, max_bytes: int) -> None:
        """Change the byte limit (evicting at once if now over it)."""
        if max_bytes < 0:
            raise ValueError(f"cache limit must be >= 0 bytes, got {max_bytes}")
        with self._lock:
            self.max_bytes = max_bytes
            self._shrink(0)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def _put(self, key: Hashable, tensor: torch.Tensor) -> None:
        size = _nbytes(tensor)
        if size > self.max_bytes:
            return
        self._shrink(size)
        self._items[key] = tensor
        self._bytes += size

    def _shrink(self, room: int) -> None:
        while self._items and self._bytes + room > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= _nbytes(old)
            self.evictions += 1


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


BUCKET_IDS: TensorLRU = TensorLRU(limit_from_env())

