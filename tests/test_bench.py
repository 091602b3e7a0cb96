"""`irpe bench`: quick mode of each subcommand writes sane JSON/MD/PNG; bad input exits 2."""
from __future__ import annotations

import json

import pytest

from irpe.cli import main

PNG_MAGIC = b"\x89PNG"


def _report(folder, kind: str) -> dict:
    """The JSON report of ``kind`` after checking its Markdown and plots exist."""
    doc = json.loads((folder / f"bench_{kind}.json").read_text())
    assert doc["kind"] == kind and doc["device"] and doc["git_sha"] and doc["versions"]["torch"]
    md = (folder / f"bench_{kind}.md").read_text()
    assert md.startswith(f"# irpe bench {kind}") and md.count("\n|") >= 2 + len(doc["results"])
    pngs = sorted(folder.glob(f"bench_{kind}*.png"))
    assert pngs and all(p.read_bytes()[:4] == PNG_MAGIC for p in pngs)
    return doc


def test_models_quick_side_by_side(tmp_path):
    assert main(["bench", "models", "--quick", "--models", "deit_tiny", "--batches", "1,2",
                 "--backends", "eager,onnxruntime", "--out", str(tmp_path)]) == 0
    doc = _report(tmp_path, "models")
    rows = doc["results"]
    assert {(r["variant"], r["backend"], r["batch"]) for r in rows} == {
        (v, b, n) for v in ("plain", "irpe_k") for b in ("eager", "onnxruntime") for n in (1, 2)}
    for r in rows:
        assert r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] and r["images_per_s"] > 0
        assert len(r["samples_ms"]) == 2 and r["peak_mb"] > 0
    assert all(r["overhead_vs_plain"] == 1.0 for r in rows if r["variant"] == "plain")
    assert len(list(tmp_path.glob("*.png"))) == 3


def test_ops_quick_and_report_regenerates(tmp_path):
    assert main(["bench", "ops", "--quick", "--out", str(tmp_path)]) == 0
    doc = _report(tmp_path, "ops")
    assert {r["op"] for r in doc["results"]} == {"gather_irpe", "gather_official", "v_irpe",
                                                 "v_official"}
    assert sorted({r["L"] for r in doc["results"]}) == doc["settings"]["lengths"] == [10, 26]
    md = tmp_path / "bench_ops.md"
    md.unlink()
    (tmp_path / "bench_ops_cost_vs_L.png").unlink()
    assert main(["bench", "report", "--out", str(tmp_path)]) == 0
    assert md.read_text().startswith("# irpe bench ops")
    assert (tmp_path / "bench_ops_cost_vs_L.png").read_bytes()[:4] == PNG_MAGIC


def test_serve_quick_real_server_process(tmp_path):
    assert main(["bench", "serve", "--quick", "--backend", "torch", "--concurrency", "1,4",
                 "--out", str(tmp_path)]) == 0
    doc = _report(tmp_path, "serve")
    assert doc["settings"]["models"] == ["tiny"]
    rows = doc["results"]
    assert [r["mode"] for r in rows] == ["in-process", "backend", "closed", "closed", "open"]
    assert all(r["model"] == "tiny" and r["images_per_s"] > 0 for r in rows)
    for r in rows[2:]:
        assert r["requests"] > 0 and r["errors"] == {} and r["p50_ms"] <= r["p99_ms"]
    best = [r for r in rows if "ratio_to_inprocess" in r]
    assert len(best) == 1 and best[0]["mode"] == "closed"
    assert best[0]["ratio_to_inprocess"] == pytest.approx(
        best[0]["images_per_s"] / rows[0]["images_per_s"])
    assert sum(doc["batch_histogram"]["tiny"].values()) > 0


def test_server_process_stops_and_reports_bad_repository(tmp_path):
    from benchmarks.serve_load import server_process, write_repository
    repo = write_repository(tmp_path, [{"name": "m", "path": tmp_path / "missing.onnx",
                                        "backend": "onnxruntime"}])
    with pytest.raises(RuntimeError, match="irpe serve exited"):
        with server_process(repo, 1, timeout_s=60):
            pass


@pytest.mark.parametrize("argv, message", [
    (["models", "--models", "vit_huge"], "unknown model family vit_huge"),
    (["models", "--batches", "1,x"], "not a comma-separated list of integers"),
    (["models", "--batches", "0"], "need positive integers"),
    (["models", "--backends", "tensorflow"], "unknown backend tensorflow"),
    (["serve", "--concurrency", "-1"], "need positive integers"),
])
def test_bad_input_one_line_exit_2(argv, message, capsys, tmp_path):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("irpe bench: error: ") and message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_report_without_json_exits_2(tmp_path, capsys):
    assert main(["bench", "report", "--out", str(tmp_path)]) == 2
    assert "no bench_*.json" in capsys.readouterr().err
