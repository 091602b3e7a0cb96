"""The ONNX Runtime export benchmark runs end to end in --quick mode and writes a sane report."""
import json

from benchmarks import export_ort


def test_quick_export_benchmark_writes_report(tmp_path):
    assert export_ort.main(["--quick", "--no-custom-ops", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "export_ort.json").read_text())
    assert set(data["results"]) == {"plain", "irpe_k"}
    assert data["results"]["plain"]["throughput_ratio"] == 1.0
    assert data["results"]["irpe_k"]["goal"] == 0.95
    assert isinstance(data["results"]["irpe_k"]["meets_goal"], bool)
    for row in data["results"].values():
        assert row["median_ms"] > 0 and row["images_per_s"] > 0 and len(row["samples_ms"]) == 1
    assert "| irpe_k | deit_tiny_patch16_224_ctx_product_50_shared_k |" in \
        (tmp_path / "export_ort.md").read_text()
