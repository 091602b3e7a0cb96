"""`irpe tune`'s search logic on a deterministic measurement function (the one fake allowed:
the real one is an `irpe serve` process under HTTP load, tests/test_tune_cli.py): the
coordinate search and its pruning, the SLO, the accuracy gate, resume from the results file
and the budget."""
from __future__ import annotations

import json
from typing import Dict, List

from serve.tune.goal import Goal, load_key
from serve.tune.search import Budget, MeasureFailed, search
from serve.tune.space import Candidate, axes, default_candidate, precisions_for, valid
from serve.tune.store import ResultStore

GOAL = Goal(clients=(16,), p99_ms=250.0)


class FakeMeasure:
    """Throughput and p99 as a fixed function of the candidate: bigger batches and int8 are
    faster, but batch 32 breaks the p99 SLO; records every call."""

    def __init__(self) -> None:
        self.calls: List[tuple] = []

    def __call__(self, cand: Candidate, seconds: float) -> Dict:
        self.calls.append((cand, seconds))
        speed = {"fp32": 1.0, "bf16": 1.6, "int8": 2.5}[cand.precision]
        speed *= {"openvino": 1.0, "onnxruntime": 0.7}[cand.backend]
        speed *= min(cand.max_batch_size, 16) ** 0.3 * (1.1 if cand.threads == 2 else 1.0)
        p99 = 400.0 if cand.max_batch_size >= 32 else 100.0 + cand.max_queue_delay_ms
        return {load_key("c", 16): {"images_per_s": 10.0 * speed, "p50_ms": p99 / 2,
                                    "p99_ms": p99, "errors": {}, "requests": 100}}


class Clock:
    """A clock that advances by ``step`` seconds per reading (a deterministic budget)."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _search(measure, store=None, gate=None, budget_s=1e9, clock=None, **kw):
    start = default_candidate("openvino")
    return search(start, axes(["openvino", "onnxruntime"], ["fp32", "bf16", "int8"], cores=2),
                  measure, GOAL, store or ResultStore(None, "ctx"),
                  Budget(budget_s, clock or Clock()), gate or (lambda c: (True, "ok")),
                  short_s=1.0, full_s=4.0, log=lambda line: None, **kw)


def test_the_best_meets_the_slo_and_dominated_candidates_are_pruned():
    measure = FakeMeasure()
    out = _search(measure)
    assert out.best is not None
    best = out.best["candidate"]
    assert best.precision == "int8" and best.max_batch_size == 16 and best.threads == 2
    assert out.best["full"]["c16"]["p99_ms"] <= 250  # batch 32 is faster but misses the SLO
    statuses = [e["status"] for e in out.entries.values()]
    assert "pruned" in statuses and statuses.count("best") == 1
    # pruning: the whole product is ~100 configurations; the search measures a few dozen
    shorts = [c for c, s in measure.calls if s == 1.0]
    assert len(shorts) == len(set(shorts)) < 30
    # only the final rung runs long: the 2 best and the default
    assert sorted(c.label() for c, s in measure.calls if s == 4.0) == sorted(
        {best.label(), default_candidate("openvino").label(),
         *[c.label() for c, e in out.entries.items() if e["status"] == "finalist"]})
    assert all(valid(c) for c, _ in measure.calls)


def test_a_precision_failing_the_accuracy_gate_is_never_measured_or_recommended():
    measure = FakeMeasure()
    checked = []

    def gate(cand):  # int8 misses the margin; bf16 holds it
        checked.append((cand.backend, cand.precision))
        return cand.precision != "int8", "top-1 drop"
    out = _search(measure, gate=gate)
    assert out.best["candidate"].precision == "bf16"
    assert all(c.precision != "int8" for c, _ in measure.calls)
    gated = [c for c, e in out.entries.items() if e["status"] == "gated"]
    assert gated and all(c.precision == "int8" for c in gated)
    assert len(checked) == len(set(checked))  # each backend x precision checked once


def test_no_candidate_meets_the_slo_then_the_nearest_miss_is_reported():
    out = search(default_candidate("openvino"), axes(["openvino"], ["fp32"], cores=2),
                 FakeMeasure(), Goal(clients=(16,), p99_ms=50.0), ResultStore(None, "c"),
                 Budget(1e9, Clock()), lambda c: (True, ""), short_s=1, full_s=4,
                 log=lambda line: None)
    assert any("no candidate meets" in n for n in out.notes)
    # the nearest miss: batch 1, no queue delay
    assert out.best is not None and out.best["full"]["c16"]["p99_ms"] == 100.0


def test_a_rerun_reuses_the_results_file(tmp_path):
    path = tmp_path / "results.jsonl"
    first = FakeMeasure()
    one = _search(first, store=ResultStore(path, "machine-a"))
    lines = path.read_text().splitlines()
    assert len(lines) == len(first.calls) + 2  # + the int8 and bf16 gate verdicts
    assert all(json.loads(line)["key"] for line in lines)
    again = FakeMeasure()
    two = _search(again, store=ResultStore(path, "machine-a"))
    assert again.calls == [] and two.best["candidate"] == one.best["candidate"]
    other = FakeMeasure()  # another machine (or model file, or load): measured afresh
    _search(other, store=ResultStore(path, "machine-b"))
    assert len(other.calls) == len(first.calls)


def test_a_stricter_gate_on_rerun_drops_stored_runs_of_that_precision(tmp_path):
    path = tmp_path / "results.jsonl"
    first = _search(FakeMeasure(), store=ResultStore(path, "m"))
    assert first.best is not None and first.best["candidate"].precision == "int8"
    again = FakeMeasure()
    out = _search(again, store=ResultStore(path, "m"), gate_id="margin 0.1",
                  gate=lambda c: (c.precision != "int8", "top-1 drop"))
    assert out.best is not None and out.best["candidate"].precision != "int8"
    assert all(c.precision != "int8" for c, _ in again.calls)
    assert any(e["status"] == "gated" for c, e in out.entries.items() if c.precision == "int8")


def test_an_interrupted_tune_resumes_where_it_stopped(tmp_path):
    path = tmp_path / "results.jsonl"

    class Interrupted(Exception):
        pass

    first = FakeMeasure()

    def stops_after_five(cand, seconds):
        if len(first.calls) == 5:
            raise Interrupted
        return first(cand, seconds)
    try:
        _search(stops_after_five, store=ResultStore(path, "m"))
    except Interrupted:
        pass
    assert len(path.read_text().splitlines()) == 5 + 2  # five measurements, two gate verdicts
    again = FakeMeasure()
    _search(again, store=ResultStore(path, "m"))
    full = FakeMeasure()
    _search(full)
    assert len(again.calls) == len(full.calls) - 5


def test_the_budget_stops_measuring_and_keeps_the_final_rung():
    # a measurement of s seconds takes s + 5 s of the clock (start-up, warm-up)
    clock, measure = Clock(), FakeMeasure()

    def timed(cand, seconds):
        clock.now += seconds + 5
        return measure(cand, seconds)
    out = _search(timed, budget_s=120.0, clock=clock)
    full = FakeMeasure()
    _search(full)
    assert len(measure.calls) < len(full.calls)
    assert any("budget ran out" in n for n in out.notes)
    assert clock.now <= 120.0 + 9  # the last one started with its estimate left
    assert out.best is not None and out.best["stage"] == "full"  # time was held for it
    nothing = _search(FakeMeasure(), budget_s=5.0, clock=Clock(step=1.0))
    assert nothing.best is None and "nothing was measured" in nothing.notes


def test_a_candidate_that_fails_to_start_is_reported_and_skipped():
    measure = FakeMeasure()

    def flaky(cand, seconds):
        if cand.backend == "onnxruntime":
            raise MeasureFailed("irpe serve exited (1) before serving")
        return measure(cand, seconds)
    out = _search(flaky)
    failed = [c for c, e in out.entries.items() if e["status"] == "failed"]
    assert failed and all(c.backend == "onnxruntime" for c in failed)
    assert out.best["candidate"].backend == "openvino"


def test_without_a_final_rung_the_screening_decides():
    measure = FakeMeasure()
    out = _search(measure, final=0)
    assert out.best is not None and out.best["stage"] == "short"
    assert out.best["candidate"].precision == "int8" and not out.notes
    assert all(seconds == 1.0 for _, seconds in measure.calls)


def test_rate_goal_minimises_p99():
    goal = Goal(clients=(1,), rate=20.0)

    def measure(cand, seconds):
        p99 = 50.0 + cand.max_queue_delay_ms * 3 + (20 if cand.instances > 1 else 0)
        answered = 20.0 if cand.max_batch_size > 1 else 15.0  # batch 1 cannot keep up
        row = {"images_per_s": answered, "p50_ms": p99 / 2, "p99_ms": p99, "errors": {},
               "requests": 100}
        return {"c1": dict(row, images_per_s=30.0), "r20": row}
    out = search(default_candidate("openvino"), axes(["openvino"], ["fp32"], cores=2),
                 measure, goal, ResultStore(None, "r"), Budget(1e9, Clock()),
                 lambda c: (True, ""), short_s=1, full_s=4, log=lambda line: None)
    assert out.best is not None
    best = out.best["candidate"]
    assert best.max_batch_size > 1 and best.max_queue_delay_ms == 2.0 and best.instances == 1


def test_space_rules():
    assert precisions_for(("avx2",)) == ["fp32"]
    assert precisions_for(("avx512_bf16", "avx512_vnni")) == ["fp32", "bf16", "int8"]
    assert precisions_for(("amx_int8",), ["fp32", "int8"]) == ["fp32", "int8"]
    assert not valid(Candidate("onnxruntime", "int8"))
    assert not valid(Candidate("onnxruntime", "bf16"))
    assert not valid(Candidate("openvino", max_batch_size=1, max_queue_delay_ms=5, ov_streams=1))
    assert default_candidate("openvino") == Candidate("openvino", ov_streams=1)
    assert default_candidate("onnxruntime").with_(ov_streams=2).ov_streams is None
    a, b = Candidate("openvino", ov_streams=1), Candidate("openvino", ov_streams=2)
    assert a.key("x") != b.key("x") and a.key("x") != a.key("y")
