"""Fault-injection backend (a test aid, selected with ``backend: fault``).

Wraps a real backend (``fault.inner``) and adds a sleep per batch, a slow load, or an error on
every batch, so timeouts (504), overload (503), readiness and failures can be exercised against
a real server. Not meant for production configs.
"""
from __future__ import annotations

import time
from typing import Dict, Optional

import numpy as np

from irpe.artifact import ModelSpec

from . import Backend, create_backend

__all__ = ["FaultBackend", "InjectedFault"]


class InjectedFault(RuntimeError):
    """The error ``fault.fail`` raises on every batch."""


class FaultBackend(Backend):
    """Delegates to ``fault.inner`` with the configured delays and failures."""

    platform = "fault_injection"

    def read_spec(self) -> ModelSpec:
        self.inner = create_backend(self.cfg.model_copy(update={"backend": self.cfg.fault.inner}),
                                    self.threads)
        return self.inner.spec

    def load(self) -> None:
        time.sleep(self.cfg.fault.load_delay_s)
        self.inner.load()

    def warmup(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        return self.inner.warmup(images, sizes)  # faults apply to served batches only

    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        time.sleep(self.cfg.fault.delay_s)
        if self.cfg.fault.fail:
            raise InjectedFault(f"injected failure (model {self.cfg.name})")
        return self.inner.infer(images, sizes)

    def close(self) -> None:
        self.inner.close()
