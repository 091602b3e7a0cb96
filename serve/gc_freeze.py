"""The served process's heap after a model loads: frozen out of the cyclic garbage collector.

A serving process holds hundreds of thousands of long-lived objects (torch, ONNX, the app, the
loaded models); every full (generation 2) collection walks all of them while holding the GIL,
and under load those collections stall every request in flight at once: the tail of the
latency distribution (docs/serve.md, "Tail latency at saturation"). Freezing what start-up
built (``gc.freeze``) leaves the collector only what requests allocate. Setting ``gc_freeze``.
"""
from __future__ import annotations

import gc

__all__ = ["freeze_loaded", "thaw"]


def freeze_loaded() -> int:
    """Collect start-up's garbage, then move every surviving object to the collector's
    permanent generation; returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw() -> None:
    """Give the frozen objects back to the collector (a stopped model's objects can be freed
    when they form cycles; an app embedded in a longer-lived process stops cleanly)."""
    gc.unfreeze()
