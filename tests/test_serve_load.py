"""`python -m benchmarks.serve_load`: p50/p99 per concurrency of a real `irpe serve` process, and
the per-second tail ratio that keeps a drifting machine out of p99/p50."""
from __future__ import annotations

import json

import pytest

from benchmarks.serve_load import local_tail
from tests.helpers import run_python
from tests.openvino_common import needs_openvino


def test_local_tail_ignores_drift_between_seconds_but_not_overtaking():
    fast, slow = [0.1] * 50, [0.2] * 50  # the machine halves its speed after one second
    sent = [i / 50 for i in range(50)] + [1 + i / 50 for i in range(50)]
    assert local_tail(sent, fast + slow) == pytest.approx(1.0)  # raw p99/p50 would be 2
    overtaken = fast[:-2] + [0.3, 0.3] + slow  # two requests waited 3x their second's median
    assert local_tail(sent, overtaken) == pytest.approx(3.0)


def test_reports_p50_p99_per_concurrency(tmp_path):
    out = tmp_path / "rows.json"
    done = run_python(["-m", "benchmarks.serve_load", "--concurrency", "1,4", "--duration",
                       "0.5", "--warmup", "0.2", "--rounds", "1", "--out", str(out)],
                      timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["server"], r["load"]) for r in rows] == [("this checkout", 1),
                                                        ("this checkout", 4)]
    for r in rows:
        assert r["errors"] == {} and r["requests"] > 0
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] and r["p99_local"] >= 1.0
    assert "| this checkout | 4 |" in done.stdout and "p99/p50" in done.stdout


@needs_openvino
@pytest.mark.parametrize("request_kind", ["v2-json", "v2-binary"])
def test_v2_requests_over_openvino_answer_without_error(tmp_path, request_kind):
    """--request v2-json / v2-binary --batch 2 --backend openvino: a real server answers every
    request (the alternated JSON-path comparison of docs/serve.md runs these)."""
    out = tmp_path / "rows.json"
    done = run_python(["-m", "benchmarks.serve_load", "--request", request_kind, "--batch", "2",
                       "--backend", "openvino", "--concurrency", "2", "--duration", "0.5",
                       "--warmup", "0.2", "--rounds", "1", "--out", str(out)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["errors"] == {} and row["requests"] > 0
