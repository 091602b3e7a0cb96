"""The op benchmarks run end to end in quick mode and write sane reports (the GPU one with
--device cpu: torch variants only, our kernels reported as not measured)."""
import json

from benchmarks import ops_common, ops_cpu, ops_gpu
from benchmarks.fits import growth


def test_ops_cpu_quick_report(tmp_path):
    assert ops_cpu.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "ops_cpu.json").read_text())
    assert data["lengths"] == [10, 26] and data["num_buckets"] == 50
    for row in data["results"].values():
        assert set(row) == {"gather_irpe", "gather_official", "v_irpe", "v_official"}
        assert all(v["median_ms"] > 0 for v in row.values())
    assert data["summary"]["gather_irpe"]["growth"][0] is None
    assert isinstance(data["summary"]["gather_irpe"]["growth"][1], float)
    assert "| 26 |" in (tmp_path / "ops_cpu.md").read_text()


def test_ops_gpu_script_on_cpu(tmp_path):
    assert ops_gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "ops_gpu.json").read_text())
    assert data["ours_unavailable"] == "our kernels need CUDA"
    assert data["gather_goal"] == "not measured"
    variants = {(r["op"], r["variant"], r["dtype"]) for r in data["results"]}
    assert variants == {(op, v, d) for d in ("float32", "float16") for op, v in
                        (("gather", "torch_gather"), ("gather", "official_flat"),
                         ("scatter", "torch_scatter_add"))}
    for r in data["results"]:
        assert r["median_ms"] > 0 and r["gb_per_s"] > 0 and r["max_abs_diff"] < 1e-2
    assert "NOT measured" in (tmp_path / "ops_gpu.md").read_text()


def test_growth_exponent_and_flat_index():
    assert growth([10, 20, 40], [1.0, 4.0, 16.0]) == [None, 2.0, 2.0]
    assert growth([10, 20], [1.0, None]) == [None, None]
    import torch
    ids = torch.tensor([[0, 2], [1, 1]])
    assert ops_common.official_flat_index(ids, 3).tolist() == [0, 2, 4, 4]
    table = torch.arange(12.0).view(1, 1, 2, 6)[..., :3].contiguous()
    assert ops_common.official_gather(table, ops_common.official_flat_index(ids, 3), 2).tolist() \
        == [[[[0.0, 2.0], [7.0, 7.0]]]]


def test_peak_table_and_goal():
    assert ops_gpu.peak_tbps("cpu", None) is None and ops_gpu.peak_tbps("cpu", 2.5) == 2.5
    row = {"op": "gather", "variant": "ours", "case": "detr_2150", "fraction_of_peak": 0.75}
    assert ops_gpu.goal_status([row]) == "met (worst 75.0%)"
    assert ops_gpu.goal_status([dict(row, fraction_of_peak=0.5)]) == "NOT met (worst 50.0%)"
