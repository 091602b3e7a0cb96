"""The search of ``irpe tune``: a coordinate search over the axes of :mod:`serve.tune.space`
on short runs, pruned to the best few after each axis, then a final rung of full-length runs
(successive halving's last step) that alone decides the winner; within a time budget,
resumable, and with an accuracy gate before any int8 / bf16 candidate is measured.

The measurement and the gate are parameters (``measure(candidate, seconds) -> result``,
``gate(candidate) -> (ok, detail)``) and so is the clock: the tests drive this logic with a
deterministic fake measurement; ``irpe tune`` passes the real ones (serve.tune.measure, an
``irpe serve`` process under HTTP load; serve.tune.accuracy, ``irpe eval``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .goal import Goal
from .space import Axis, Candidate
from .store import ResultStore

__all__ = ["Budget", "MeasureFailed", "Outcome", "search"]

Result = Dict[str, Dict[str, Any]]
Measure = Callable[[Candidate, float], Result]
Gate = Callable[[Candidate], Tuple[bool, str]]


class MeasureFailed(RuntimeError):
    """A candidate that could not be measured (its server did not start, or died)."""


@dataclass
class Budget:
    """``seconds`` of wall time from the first call of :meth:`left` (``clock``: monotonic)."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    start: Optional[float] = None

    def left(self) -> float:
        """Seconds left (negative once spent)."""
        if self.start is None:
            self.start = self.clock()
        return self.seconds - (self.clock() - self.start)


@dataclass
class Outcome:
    """What the search found: ``best`` (a candidate's entry, or None), every ``entry`` by
    candidate (status, short and full results), the ``notes`` to report."""

    best: Optional[Dict[str, Any]]
    entries: Dict[Candidate, Dict[str, Any]]
    notes: List[str] = field(default_factory=list)
    start: Optional[Candidate] = None


@dataclass
class _Run:
    measure: Measure
    gate: Gate
    goal: Goal
    store: ResultStore
    budget: Budget
    short_s: float
    full_s: float
    estimate: Callable[[float], float]
    log: Callable[[str], None]
    entries: Dict[Candidate, Dict[str, Any]] = field(default_factory=dict)
    walls: Dict[str, float] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    out_of_budget: bool = False
    gates_logged: Set[Tuple[str, str]] = field(default_factory=set)
    gate_id: str = ""
    final: int = 2

    def cost(self, stage: str) -> float:
        """Seconds one ``stage`` measurement is expected to take: the longest seen so far,
        else the estimate of its duration."""
        seconds = self.short_s if stage == "short" else self.full_s
        return self.walls.get(stage, self.estimate(seconds))

    def entry(self, cand: Candidate) -> Dict[str, Any]:
        return self.entries.setdefault(cand, {"candidate": cand, "status": "new"})

    def gated(self, cand: Candidate) -> bool:
        """Whether ``cand``'s precision fails the accuracy gate (checked once per backend and
        precision, the verdict kept in the results file)."""
        if cand.precision == "fp32":
            return False
        key = self.store.key("gate", cand.backend, cand.precision, self.gate_id)
        record, how = self.store.get(key), " (reused)"
        if record is None:
            ok, detail = self.gate(cand)
            record = {"kind": "gate", "backend": cand.backend, "precision": cand.precision,
                      "ok": ok, "detail": detail}
            self.store.put(key, record)
            how = ""
        if (cand.backend, cand.precision) not in self.gates_logged:
            self.gates_logged.add((cand.backend, cand.precision))
            self.log(f"accuracy gate {cand.backend} {cand.precision}: "
                     f"{'pass' if record['ok'] else 'FAIL'} ({record['detail']}){how}")
        if not record["ok"]:
            self.entry(cand).update(status="gated", detail=record["detail"])
        return not record["ok"]

    def run(self, cand: Candidate, stage: str, reserve: float = 0.0) -> Optional[Result]:
        """``cand`` measured at ``stage`` (short | full): reused from the results file, else
        measured when the budget (less ``reserve``) allows; None when not measured."""
        entry = self.entry(cand)
        if stage in entry:
            return entry[stage]
        key = self.record_key(cand, stage)
        record = self.store.get(key)
        how = "reused"
        if record is None:  # the budget is checked before the gate: it costs time too
            if self.budget.left() - reserve < self.cost(stage):
                if not self.out_of_budget:
                    self.log(f"budget: {max(0.0, self.budget.left()):.0f} s left, "
                             f"{reserve:.0f} s of it held for the final rung; a {stage} run "
                             f"takes ~{self.cost(stage):.0f} s: no more {stage} runs")
                self.out_of_budget = True
                return None
        if self.gated(cand):  # a stored run too: the margin or the data may have changed
            return None
        if record is None:
            began = self.budget.clock()
            seconds = self.short_s if stage == "short" else self.full_s
            try:
                result = self.measure(cand, seconds)
            except MeasureFailed as exc:
                entry.update(status="failed", detail=str(exc))
                self.log(f"  {cand.label():<40} {stage:<5} FAILED: {exc}")
                return None
            wall = self.budget.clock() - began
            self.walls[stage] = max(self.walls.get(stage, 0.0), wall)
            record = {"kind": "measure", "candidate": cand.as_dict(), "stage": stage,
                      "seconds": seconds, "result": result, "wall_s": round(wall, 1)}
            self.store.put(key, record)
            how = f"{wall:.0f} s"
        entry[stage] = record["result"]
        entry["status"] = "measured"
        self.log(f"  {cand.label():<40} {stage:<5} {_summary(self.goal, record['result'])} "
                 f"({how})")
        return record["result"]

    def record_key(self, cand: Candidate, stage: str) -> str:
        """The results-file key of ``cand`` measured at ``stage``."""
        seconds = self.short_s if stage == "short" else self.full_s
        return self.store.key(cand.canonical(), stage, seconds)

    def score(self, cand: Candidate, stage: str) -> Tuple[int, float]:
        return self.goal.score(self.entries[cand][stage])


def _summary(goal: Goal, result: Result) -> str:
    row = goal.main_row(result)
    misses = goal.violations(result)
    text = (f"{row.get('images_per_s', 0.0):7.1f} img/s p50 {row.get('p50_ms', float('nan')):6.1f}"
            f" p99 {row.get('p99_ms', float('nan')):6.1f} ms")
    return text + (f" [misses: {'; '.join(misses)}]" if misses else "")


def search(start: Candidate, axes: Sequence[Axis], measure: Measure, goal: Goal,
           store: ResultStore, budget: Budget, gate: Gate, keep: int = 2, final: int = 2,
           short_s: float = 3.0, full_s: float = 10.0,
           estimate: Callable[[float], float] = lambda s: s + 10.0,
           log: Callable[[str], None] = print, gate_id: str = "") -> Outcome:
    """Walk ``axes`` from ``start`` keeping the ``keep`` best (short runs) after each, then
    measure the ``final`` best and ``start`` at full length; the best full run that meets the
    goal wins (else the best short run, said in the notes). Time for the final rung is held
    back from the axes; nothing is started once ``budget`` is spent. ``gate_id`` names what the
    gate checks against (data, margin): its verdicts are kept under it."""
    r = _Run(measure, gate, goal, store, budget, short_s, full_s, estimate, log,
             gate_id=gate_id, final=final)
    reserve = (final + 1) * r.cost("full") if final else 0.0
    seeds = [start]
    r.run(start, "short", reserve)
    for axis in axes:
        group = list(dict.fromkeys(c for seed in seeds for c in axis.expand(seed)))
        log(f"{axis.name}: {len(group)} candidates from {len(seeds)} seed(s)")
        for cand in group:
            r.run(cand, "short", reserve)
        done = sorted((c for c in group if "short" in r.entry(c)),
                      key=lambda c: r.score(c, "short"), reverse=True)
        pruned = [c for c in done[keep:] if r.entries[c]["status"] == "measured"]
        for cand in pruned:
            r.entries[cand]["status"] = "pruned"
        if done:
            log(f"{axis.name}: kept {', '.join(c.label() for c in done[:keep])}; "
                f"pruned {len(pruned)}")
        seeds = done[:keep] or seeds
    if final > 0:  # 0: no final rung, the screening decides
        _final_rung(r, start, final)
    return _outcome(r, start)


def _final_rung(r: _Run, start: Candidate, final: int) -> None:
    """The ``final`` best short runs and ``start`` measured at full length."""
    shorts = sorted((c for c, e in r.entries.items() if "short" in e),
                    key=lambda c: r.score(c, "short"), reverse=True)
    measured = [c for c in shorts if r.store.get(r.record_key(c, "full"))]  # earlier runs'
    finalists = list(dict.fromkeys([*shorts[:final], start, *measured]))
    r.log(f"final rung: {len(finalists)} candidate(s) at {r.full_s:g} s")
    for cand in finalists:
        r.run(cand, "full")
        if "full" in r.entries[cand]:
            r.entries[cand]["status"] = "finalist"


def _outcome(r: _Run, start: Candidate) -> Outcome:
    if r.out_of_budget:
        r.notes.append("the budget ran out: candidates not measured are marked 'not measured'")
    fulls = [c for c, e in r.entries.items() if "full" in e]
    stage = "full" if fulls else "short"
    pool = fulls or [c for c, e in r.entries.items() if "short" in e]
    if not pool:
        r.notes.append("nothing was measured")
        return Outcome(None, r.entries, r.notes, start)
    if not fulls and r.final:
        r.notes.append("no full-length run fitted the budget: the best short run is reported")
    best = max(pool, key=lambda c: r.score(c, stage))
    if r.score(best, stage)[0] == 0:
        r.notes.append("no candidate meets the goal's constraints; the nearest miss is reported")
    r.entries[best]["status"] = "best"
    return Outcome({**r.entries[best], "stage": stage}, r.entries, r.notes, start)
