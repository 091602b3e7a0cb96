"""The forward benchmark runs end to end in --quick mode and writes a sane report."""
import json

from benchmarks import deit_forward


def test_quick_benchmark_writes_report(tmp_path):
    assert deit_forward.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "deit_forward.json").read_text())
    assert set(data["results"]) == {"plain", "irpe_k"}
    assert data["results"]["plain"]["ratio_to_plain"] == 1.0
    for row in data["results"].values():
        assert row["median_ms"] > 0 and row["images_per_s"] > 0 and len(row["samples_ms"]) == 1
    assert "| irpe_k |" in (tmp_path / "deit_forward.md").read_text()
