"""What ``irpe tune`` optimises: the goal, the SLO and how one measurement scores against them.

A measurement is a dict of load rows keyed by :func:`load_key` (``c16``: 16 closed-loop
clients; ``r20``: an open-loop rate of 20 requests/s), each row as benchmarks.serve_load
gives it (``images_per_s``, ``p50_ms``, ``p99_ms``, ``errors``, ``requests``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

__all__ = ["Goal", "load_key"]

Row = Dict[str, Any]
RATE_SHORTFALL = 0.9  # an open-loop run that answers under 90 % of the asked rate is overloaded


def load_key(kind: str, load: float) -> str:
    """'c16' for 16 closed-loop clients, 'r20' for an open-loop rate of 20 requests/s."""
    return f"{kind}{load:g}"


@dataclass(frozen=True)
class Goal:
    """Max throughput at the most ``clients`` with p99 <= ``p99_ms`` at every client count;
    or, with ``rate``, min p99 at that open-loop rate (p99 <= ``p99_ms`` when given)."""

    clients: Tuple[int, ...] = (1,)
    p99_ms: Optional[float] = None
    rate: Optional[float] = None

    def loads(self) -> Tuple[Tuple[str, float], ...]:
        """The loads each candidate is measured at: ("closed", clients)..., ("open", rate)."""
        out = tuple(("closed", float(c)) for c in self.clients)
        return out + ((("open", self.rate),) if self.rate else ())

    def describe(self) -> str:
        """The goal in words (the report's first line)."""
        slo = f" with p99 <= {self.p99_ms:g} ms" if self.p99_ms else ""
        if self.rate:
            return f"min p99 at {self.rate:g} requests/s{slo}"
        most = max(self.clients)
        return f"max throughput at {most} client{'s' * (most > 1)}{slo}"

    def main_row(self, result: Dict[str, Row]) -> Row:
        """The row the goal is scored on: the rate's, else the most clients'."""
        key = load_key("r", self.rate) if self.rate else load_key("c", max(self.clients))
        return result.get(key, {})

    def violations(self, result: Dict[str, Row]) -> list:
        """Why ``result`` misses the goal's constraints (empty: it meets them)."""
        out = []
        for kind, load in self.loads():
            row = result.get(load_key("c" if kind == "closed" else "r", load))
            name = f"{load:g} clients" if kind == "closed" else f"{load:g} req/s"
            if not row or not row.get("requests"):
                out.append(f"no answers at {name}")
                continue
            if row.get("errors"):
                out.append(f"errors at {name}: {row['errors']}")
            if self.p99_ms and row.get("p99_ms", float("inf")) > self.p99_ms:
                out.append(f"p99 {row.get('p99_ms', float('nan')):.0f} ms > {self.p99_ms:g} "
                           f"at {name}")
            if kind == "open" and row.get("images_per_s", 0.0) < RATE_SHORTFALL * load:
                out.append(f"{row.get('images_per_s', 0.0):.1f}/s answered of {load:g}/s")
        return out

    def score(self, result: Dict[str, Row]) -> Tuple[int, float]:
        """Sort key, higher is better: (1, objective) when the constraints hold, else (0, -worst
        p99) so the nearest miss ranks first among misses. Objective: throughput at the most
        clients, or -p99 at the rate."""
        row = self.main_row(result)
        if self.violations(result):
            worst = max((r.get("p99_ms", float("inf")) for r in result.values()),
                        default=float("inf"))
            return 0, -worst
        if self.rate:
            return 1, -row["p99_ms"]
        return 1, row["images_per_s"]
