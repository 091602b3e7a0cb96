"""The fault-injection backend for serving tests (registered through
serve.backends.register_backend); needs the serving stack, so tests.helpers loads it lazily."""
from __future__ import annotations

import threading
import time
from typing import Dict, Optional

import numpy as np

from serve.backends import Artifact, Backend, create_backend, register_backend

__all__ = ["FaultBackend", "InjectedFault", "fault_backend"]


class InjectedFault(RuntimeError):
    """The error a ``fail=True`` fault backend raises on every served batch."""


class FaultBackend(Backend):
    """A real inner backend plus a sleep per batch, a slow load, an error on every batch, or a
    ``gate`` (threading.Event) that loading and every served batch wait for: tests open it
    when they are ready, instead of guessing a duration."""

    platform = "fault_injection"

    def __init__(self, cfg, threads: int = 0, inner: str = "torch", delay_s: float = 0.0,
                 load_delay_s: float = 0.0, fail: bool = False,
                 gate: Optional[threading.Event] = None) -> None:
        self.delay_s, self.load_delay_s, self.fail, self.gate = (delay_s, load_delay_s, fail,
                                                                 gate)
        self.inner = create_backend(cfg.model_copy(update={"backend": inner}), threads)
        super().__init__(cfg, threads)

    def _pass_gate(self) -> None:
        if self.gate is not None and not self.gate.wait(120):
            raise InjectedFault(f"gate of model {self.cfg.name} not opened within 120 s")

    def read_artifact(self) -> Artifact:
        return Artifact(self.inner.spec, self.inner.file_precision)

    def load(self) -> None:
        self._pass_gate()
        time.sleep(self.load_delay_s)  # the fault itself: a slow load, not synchronisation
        self.inner.load()

    def warmup(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        return self.inner.warmup(images, sizes)  # faults apply to served batches only

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        self._pass_gate()
        time.sleep(self.delay_s)  # the fault: a slow batch
        if self.fail:
            raise InjectedFault(f"injected failure (model {self.cfg.name})")
        return self.inner.infer(images, sizes)

    def close(self) -> None:
        self.inner.close()


def fault_backend(delay_s: float = 0.0, load_delay_s: float = 0.0, fail: bool = False,
                  inner: str = "torch", gate: Optional[threading.Event] = None) -> str:
    """Register a FaultBackend with these options; returns its backend name for configs."""
    name = f"fault-{inner}-d{delay_s:g}-l{load_delay_s:g}" + ("-fail" if fail else "") + (
        f"-gate{id(gate):x}" if gate is not None else "")
    register_backend(name, lambda cfg, threads: FaultBackend(
        cfg, threads, inner, delay_s, load_delay_s, fail, gate))
    return name
