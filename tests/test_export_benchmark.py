"""The ONNX Runtime export benchmark runs end to end in --quick mode and writes a sane report."""
import json
import time

import pytest

from benchmarks import export_ort
from tests.helpers import run_python


@pytest.mark.parametrize("own_pools", [False, True])
def test_quick_export_benchmark_writes_report(tmp_path, own_pools):
    # its own process, as users run it: the shared ONNX Runtime pool is process-wide
    done = run_python(["-m", "benchmarks.export_ort", "--quick", "--no-custom-ops", "--out",
                       str(tmp_path)] + ["--own-pools"] * own_pools)
    assert done.returncode == 0, done.stderr[-2000:]
    stem = "export_ort_own_pools" if own_pools else "export_ort"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{stem}.json", f"{stem}.md"]
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["thread_pool"] == ("per session" if own_pools else "shared")
    assert set(data["results"]) == {"plain", "irpe_k"}
    assert data["results"]["plain"]["throughput_ratio"] == 1.0
    assert data["sessions"] == 1  # --quick: one session per row
    assert data["results"]["irpe_k"]["goal"] == 0.95
    assert isinstance(data["results"]["irpe_k"]["meets_goal"], bool)
    for row in data["results"].values():
        assert row["median_ms"] > 0 and row["images_per_s"] > 0 and len(row["samples_ms"]) == 1
    report = (tmp_path / f"{stem}.md").read_text()
    assert "| irpe_k | deit_tiny_patch16_224_ctx_product_50_shared_k |" in report
    assert f"{data['thread_pool']} thread pool" in report


def test_round_robin_runs_every_session_once_per_round_and_averages_them():
    calls = []

    def run(name, seconds=0.0):
        return lambda: (calls.append(name), time.sleep(seconds))

    runs = {"a": [run("a0", 0.02), run("a1", 0.04)], "b": [run("b0")]}
    times = export_ort.round_robin(runs, repeats=2, warmup=1, label="t")
    assert calls == ["a0", "b0", "a1"] * 3  # session n of every row, then session n + 1
    assert len(times["a"]) == len(times["b"]) == 2  # warm-up round dropped
    assert all(t >= 0.03 for t in times["a"])  # the mean of its two sessions' runs


def test_bad_counts_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        export_ort.main(["--sessions", "0"])
    assert exit_.value.code == 2
    assert "--sessions must be >= 1" in capsys.readouterr().err
