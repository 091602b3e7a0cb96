"""benchmarks.ort_pools: the demo models called in turn, one shared pool vs a pool per model,
each mode in a process of its own; a sane report, bad counts exit 2."""
import json

from tests.helpers import run_python


def _run(*argv):
    return run_python(["-m", "benchmarks.ort_pools", *argv])


def test_quick_run_reports_both_modes(tmp_path):
    done = _run("--quick", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "ort_pools.json").read_text())
    assert set(data["modes"]) == {"shared", "per_model"} and data["repeats"] == 5
    for rows in data["modes"].values():
        assert set(rows) == {"deit_shapes_irpe", "detr_shapes_irpe"}
        assert all(r["alone_ms"] > 0 and r["mixed_ms"] > 0 for r in rows.values())
    report = (tmp_path / "ort_pools.md").read_text()
    assert "| per_model | detr_shapes_irpe |" in report and "a pool per model / one" in report


def test_bad_counts_exit_2():
    done = _run("--repeats", "0")
    assert done.returncode == 2 and "--repeats must be >= 1" in done.stderr
