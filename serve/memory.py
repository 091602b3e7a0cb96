"""What each served model holds in memory: the process's resident set growth (and, on CUDA, the
device memory growth) across its load and warm-up, one model instance at a time.

Models load concurrently (each in its own inference thread), and RSS is process-wide, so each
instance's load + warm-up takes the process-wide ``LOAD_LOCK``: one measures alone. A load
that waits longer than ``WAIT_S`` for the lock (one that hangs, e.g. on a closed gate) goes on
unmeasured rather than blocking the others; the figures of any load it overlapped become
unknown (None) instead of wrong.
"""
from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

__all__ = ["Footprint", "LOAD_LOCK", "measure", "peak_rss_bytes", "rss_bytes"]

LOAD_LOCK = threading.Lock()  # process-wide: RSS is the process's, whatever the app
WAIT_S = 120.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UNMEASURED = {"started": 0, "running": 0}  # loads without the lock: overlapping one voids a figure
_COUNTS = threading.Lock()  # guards _UNMEASURED


@dataclass
class Footprint:
    """Bytes a load + warm-up added: host (RSS), device (CUDA); None where unknown."""

    host_bytes: Optional[int] = None
    device_bytes: Optional[int] = None

    def add(self, other: "Footprint") -> "Footprint":
        """The sum (several instances); unknown if either is."""
        def plus(a: Optional[int], b: Optional[int]) -> Optional[int]:
            return None if a is None or b is None else a + b
        return Footprint(plus(self.host_bytes, other.host_bytes),
                         plus(self.device_bytes, other.device_bytes))


def rss_bytes() -> Optional[int]:
    """The process's resident set size now (Linux /proc/self/statm); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def peak_rss_bytes() -> int:
    """The process's peak resident set size (getrusage; Linux counts KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _device_reader(backend: str, device: str) -> Callable[[], Optional[int]]:
    """Device bytes in use as a number that grows with the model: torch's allocated tensors for
    the torch backend, the device's used memory (total - free, every allocator and the CUDA
    context included) for other backends; none on the CPU."""
    if not device.startswith("cuda"):
        return lambda: None
    import torch
    if backend == "torch":
        return lambda: int(torch.cuda.memory_allocated(device))

    def used() -> int:
        free, total = torch.cuda.mem_get_info(device)
        return int(total - free)
    return used


@contextlib.contextmanager
def measure(backend: str, device: str, into: Callable[[Footprint], None]) -> Iterator[None]:
    """Around one instance's load + warm-up (in its inference thread): alone under
    ``LOAD_LOCK``; ``into`` gets the growth, or unknown figures when it could not be alone."""
    alone = LOAD_LOCK.acquire(timeout=WAIT_S)
    if not alone:
        _count(started=1, running=1)
    device_now = _device_reader(backend, device)
    try:
        seen = _count()
        host0, device0 = rss_bytes(), device_now()
        yield
        host1, device1 = rss_bytes(), device_now()
        clean = alone and seen["running"] == 0 and _count() == seen
        if clean and host0 is not None and host1 is not None:
            into(Footprint(host1 - host0, None if device0 is None or device1 is None
                           else device1 - device0))
        else:
            into(Footprint())
    finally:
        if alone:
            LOAD_LOCK.release()
        else:
            _count(running=-1)


def _count(**change: int) -> dict:
    """Apply ``change`` to the unmeasured-load counts; a copy of them after it."""
    with _COUNTS:
        for key, delta in change.items():
            _UNMEASURED[key] += delta
        return dict(_UNMEASURED)
