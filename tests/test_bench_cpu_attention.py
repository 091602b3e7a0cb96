"""Issue 31's benchmark commands in quick mode: the unfused rows, the throughput ratios, the DETR
peak memory rows and the candidates table (plumbing; the figures are in docs/benchmarks.md)."""
import json

import torch

from benchmarks import cpu_attention_candidates, deit_forward, detr_memory


def test_deit_forward_unfused_rows_and_detr_memory(tmp_path):
    assert deit_forward.main(["--quick", "--unfused", "--sdpa", "--detr-memory", "--out",
                              str(tmp_path)]) == 0
    data = json.loads((tmp_path / "deit_forward.json").read_text())
    rows = data["results"]
    assert set(rows) == {"plain", "irpe_k", "irpe_k_unfused", "irpe_k_sdpa"}
    assert rows["irpe_k"]["goal"] == 0.95 and rows["irpe_k_unfused"]["goal"] is None
    for row in rows.values():
        assert abs(row["throughput_ratio"] * row["ratio_to_plain"] - 1) < 1e-9
        assert row["meets_goal"] is None or row["meets_goal"] == (row["throughput_ratio"] >= 0.95)
    memory = data["detr_memory"]
    assert set(memory["results"]) == set(detr_memory.VARIANTS)
    assert all(row["peak_mib"] > 0 for row in memory["results"].values())
    assert memory["results"]["plain"]["x_plain"] == 1.0
    text = (tmp_path / "deit_forward.md").read_text()
    assert "| irpe_k_unfused |" in text and "DETR peak memory, 128x192" in text
    assert "iRPE attention kernel: " in text  # loaded (its path) or "not built"


def test_peak_bytes_sees_a_large_temporary():
    """The profiler-based peak counts a tensor freed before the forward returns."""
    class Temp(torch.nn.Module):
        def forward(self, x):
            return (x.repeat(64, 1) * 2).sum()

    x = torch.zeros(1024, 256)  # 1 MiB; the temporary is 64 MiB
    assert detr_memory.peak_bytes(Temp(), x, unfused=False) >= 64 * 2 ** 20


def test_candidates_table(capsys):
    assert cpu_attention_candidates.main(["--batch", "1", "--repeats", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    for name in ("plain:sdpa", "k:unfused", "k:sdpa_mask_index_select", "qkv:unfused",
                 "qkv:one_pass_scatter_add", "qkv:one_pass_onehot_bmm"):
        assert f"| {name} |" in out
