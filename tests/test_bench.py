"""`irpe bench`: quick mode of each subcommand writes sane JSON/MD/PNG; bad input exits 2."""
from __future__ import annotations

import json

import pytest

from irpe.cli import main
from tests.helpers import run_python

PNG_MAGIC = b"\x89PNG"


def _report(folder, kind: str) -> dict:
    """The JSON report of ``kind`` after checking its Markdown and plots exist."""
    return _report_file(folder, f"bench_{kind}", kind)


def _report_file(folder, stem: str, kind: str) -> dict:
    """The JSON report ``stem``.json after checking its Markdown and plots exist."""
    doc = json.loads((folder / f"{stem}.json").read_text())
    assert doc["kind"] == kind and doc["device"] and doc["git_sha"] and doc["versions"]["torch"]
    md = (folder / f"{stem}.md").read_text()
    assert md.startswith(f"# irpe bench {kind}") and md.count("\n|") >= 2 + len(doc["results"])
    pngs = sorted(folder.glob(f"{stem}*.png"))
    assert pngs and all(p.read_bytes()[:4] == PNG_MAGIC for p in pngs)
    return doc


def test_models_quick_side_by_side(tmp_path):
    # its own process, as users run it: the shared ONNX Runtime pool is process-wide
    done = run_python(["-m", "irpe.cli", "bench", "models", "--quick", "--models", "deit_tiny",
                       "--batches", "1,2", "--backends", "eager,onnxruntime", "--out",
                       str(tmp_path)], timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = _report(tmp_path, "models")
    assert doc["settings"]["ort_thread_pool"] == "shared"
    rows = doc["results"]
    assert {(r["variant"], r["backend"], r["batch"]) for r in rows} == {
        (v, b, n) for v in ("plain", "irpe_k") for b in ("eager", "onnxruntime") for n in (1, 2)}
    for r in rows:
        assert r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] and r["images_per_s"] > 0
        assert len(r["samples_ms"]) == 2 and r["peak_mb"] > 0
    assert all(r["overhead_vs_plain"] == 1.0 for r in rows if r["variant"] == "plain")
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        f"bench_models_{f}.png" for f in ("irpe_cost", "latency", "memory", "throughput")]


def test_ops_quick_and_report_regenerates(tmp_path):
    assert main(["bench", "ops", "--quick", "--out", str(tmp_path)]) == 0
    doc = _report(tmp_path, "ops")
    assert {r["op"] for r in doc["results"]} == {"gather_irpe", "gather_official", "v_irpe",
                                                 "v_official"}
    assert sorted({r["L"] for r in doc["results"]}) == doc["settings"]["lengths"] == [10, 26]
    assert {f["op"] for f in doc["fits"]} == {r["op"] for r in doc["results"]}
    assert all(f["lengths"] == [10, 26] and f["slope"] is not None for f in doc["fits"])
    text = (tmp_path / "bench_ops.md").read_text()
    assert "## Fitted growth" in text and "Custom CUDA kernels:" in text
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


def test_models_quick_detr_plain_vs_irpe_tagged(tmp_path):
    assert main(["bench", "models", "--quick", "--models", "detr_small", "--backends", "eager",
                 "--batches", "1", "--detr-sizes", "64x96,96x128", "--tag", "detr",
                 "--out", str(tmp_path)]) == 0
    doc = _report_file(tmp_path, "bench_models_detr", "models")
    assert [(r["variant"], r["size"]) for r in doc["results"]] == [("plain", "64x96"),
                                                                   ("irpe_k", "64x96")]
    assert doc["results"][0]["model"] == "detr_tiny_irpe (rpe_config=None)"
    assert all(r["build_s"] > 0 and r["p50_ms"] > 0 for r in doc["results"])
    assert not (tmp_path / "bench_models.json").exists()


def test_fit_slope_recovers_power_law():
    from benchmarks.fits import fit_slope
    lengths = [50, 197, 401, 785, 1601]
    assert fit_slope(lengths, [3e-4 * n ** 2.37 for n in lengths]) == pytest.approx(2.37)
    assert fit_slope(lengths, [None, 2.0, 0.0, 8.0, None]) == pytest.approx(1.0, abs=0.03)
    assert fit_slope([50], [1.0]) is None and fit_slope([50, 50], [1.0, 2.0]) is None


def _ops_doc():
    """A synthetic ops report: CPU t = L^2 exactly, CUDA rows t = L^1.5 on the DETR cases."""
    cpu = [{"op": op, "L": n, "median_ms": 1e-4 * n ** 2} for op in ("gather_irpe", "v_irpe")
           for n in (50, 197, 401)]
    gpu = [{"op": "gather_ours", "device": "cuda", "case": case, "dtype": "float16", "L": n,
            "median_ms": 1e-5 * n ** 1.5, "gb_per_s": 100.0, "fraction_of_peak": 0.5,
            "speedup": 2.0} for case, n in (("detr_950", 950), ("detr_2150", 2150),
                                            ("deit_s_bs64", 197))]
    return {"kind": "ops", "device": "test", "date": "-", "git_sha": "-", "cpu_count": 2,
            "torch_threads": 1, "versions": {"torch": "-"}, "notes": [],
            "settings": {"gpu_ops": "measured"}, "results": cpu + gpu}


def test_ops_fits_legend_and_cuda_table(tmp_path):
    from benchmarks import plots
    from benchmarks.fits import fits
    from benchmarks.report import save
    doc = _ops_doc()
    doc["fits"] = fits(doc["results"])
    slopes = {f["op"]: f["slope"] for f in doc["fits"]}
    assert slopes["gather_irpe"] == pytest.approx(2.0) and slopes["v_irpe"] == pytest.approx(2.0)
    assert slopes["cuda gather_ours float16"] == pytest.approx(1.5)  # deit_s_bs64 not fitted
    assert set(plots.ops_series(doc)) == {"gather_irpe (fitted p=2.00)", "v_irpe (fitted p=2.00)",
                                          "cuda gather_ours float16 (fitted p=1.50)"}
    save(doc, tmp_path, "synthetic")
    md = (tmp_path / "bench_ops_synthetic.md").read_text()
    assert "| cuda gather_ours float16 | 1.50 | 950, 2150 |" in md
    assert "| deit_s_bs64 | float16 | gather_ours | 197 |" in md
    assert (tmp_path / "bench_ops_synthetic_cost_vs_L.png").read_bytes()[:4] == PNG_MAGIC


def _models_doc(batches=(1, 8)):
    """A synthetic models report: two families x two backends, iRPE-K/QKV for one family only;
    iRPE costs 10 % per term letter, memory grows 20 MB per letter over plain's 100 MB."""
    rows = []
    for family, variants in (("deit_tiny", ("plain", "irpe_k")),
                             ("deit_small", ("plain", "irpe_k", "irpe_qkv"))):
        for backend in ("eager", "onnxruntime"):
            for batch in batches:
                for v in variants:
                    terms = len(v) - 5 if v != "plain" else 0
                    rows.append({"family": family, "variant": v, "backend": backend,
                                 "precision": "fp32", "size": "224x224", "batch": batch,
                                 "images_per_s": 10.0 * batch * (1 - 0.1 * terms),
                                 "p50_ms": 100.0, "p90_ms": 110.0, "p99_ms": 120.0,
                                 "rss_delta_mb": 100.0 + 20 * terms, "peak_mb": 500.0})
    rows.append({"family": "deit_small", "variant": "irpe_k", "backend": "compile",
                 "precision": "fp32", "size": "224x224", "batch": 1, "error": "no compiler"})
    return {"kind": "models", "device": "cpu-2c-amd-epyc-avx512", "date": "2026-01-02 03:04",
            "git_sha": "abc1234", "cpu_count": 2, "torch_threads": 2,
            "versions": {"torch": "-"}, "notes": [], "settings": {"threads": 2, "repeats": 5},
            "results": rows}


def _legends_outside(fig):
    """Every legend of ``fig`` drawn clear of every axes (no legend over data)."""
    fig.canvas.draw()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends
    for leg in legends:
        box = leg.get_window_extent()
        assert box.width > 0 and box.height > 0
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent()), (leg, ax)


def test_models_figures_from_a_synthetic_report(tmp_path):
    from matplotlib.colors import to_hex

    from benchmarks import plots
    doc = _models_doc()
    title = "2-core AMD EPYC, AVX-512  ·  2026-01-02 03:04  ·  2 threads"

    cost = plots.irpe_cost_figure(doc)  # a panel per batch, a bar per (model, backend, variant)
    assert [ax.get_title() for ax in cost.axes] == ["batch 1", "batch 8"]
    for ax, na in zip(cost.axes, ({"n/a"}, set()), strict=True):  # compile failed at batch 1
        bars = [(round(b.get_x(), 6), round(b.get_x() + b.get_width(), 6), to_hex(b.get_fc()))
                for b in ax.patches]
        assert len(bars) == 2 * 1 + 2 * 2  # compile: only an error row, no bar
        assert all(start == 1.0 for start, _, _ in bars)  # bars from the 1.0 reference
        assert sorted({(round(end, 2), c) for _, end, c in bars}) == [
            (0.7, "#009e73"), (0.9, "#0072b2")]  # iRPE-K 0.9, iRPE-QKV 0.7 of plain
        assert {t.get_text() for t in ax.texts} == {"0.90", "0.70", *na}
    assert [t.get_text() for t in cost.legends[0].get_texts()] == ["iRPE-K", "iRPE-QKV"]
    assert title in cost.get_suptitle()
    _legends_outside(cost)

    lines = plots.throughput_figure(doc)  # a panel per backend, a line per model and variant
    panels = [ax for ax in lines.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["eager", "onnxruntime", "compile"]
    assert [len(ax.get_lines()) for ax in panels] == [5, 5, 0]
    eager = panels[0].get_lines()
    assert len({ln.get_color() for ln in eager}) == 2  # one colour per model
    assert len({(ln.get_linestyle(), ln.get_marker()) for ln in eager}) == 3  # one per variant
    assert [list(ln.get_xdata()) for ln in eager] == [[1, 8]] * 5
    _legends_outside(lines)

    memory = plots.memory_figure(doc)
    assert {t.get_text().split()[0] for ax in memory.axes for t in ax.texts} == {
        "1.20", "1.60", "n/a"}
    assert "1.20  (120 / 100 MB)" in {t.get_text() for ax in memory.axes for t in ax.texts}
    _legends_outside(memory)
    latency = plots.latency_figure(doc)
    assert sum(t.get_text() == "100 ms" for ax in latency.axes for t in ax.texts) == 2 * 10
    _legends_outside(latency)

    one = plots.throughput_figure(_models_doc(batches=(1,)))  # one batch size: grouped bars
    assert len(one.axes[0].patches) == 10 and "batch 1" in one.get_suptitle()
    _legends_outside(one)

    paths = plots.models_plots(doc, tmp_path / "bench_models_synthetic")
    assert [p.name for p in paths] == [f"bench_models_synthetic_{s}.png" for s in
                                       ("irpe_cost", "throughput", "latency", "memory")]
    assert all(p.read_bytes()[:4] == PNG_MAGIC for p in paths)


def test_ops_and_serve_legends_outside(tmp_path):
    from benchmarks import plots
    ops = plots.ops_figure(_ops_doc())
    assert len(ops.axes[0].get_lines()) == 3
    _legends_outside(ops)
    serve = {"kind": "serve", "device": "gpu-nvidia-h100-80gb-hbm3", "date": "-",
             "git_sha": "-", "settings": {"backend": "torch", "max_batch_size": 8},
             "batch_histogram": {"tiny": {"1": 3, "8": 2}}, "results": [
                 {"model": "tiny", "mode": "in-process", "load": 8, "images_per_s": 100.0},
                 {"model": "tiny", "mode": "backend", "load": 8, "images_per_s": 120.0},
                 *({"model": "tiny", "mode": mode, "load": n, "images_per_s": 10.0 * n,
                    "p50_ms": 5.0 * n, "p90_ms": 6.0 * n, "p99_ms": 7.0 * n}
                   for mode in ("closed", "closed x8") for n in (1, 4))]}
    fig = plots.serve_figure(serve)
    assert "NVIDIA H100 80GB HBM3" in fig.get_suptitle()
    assert [len(ax.get_lines()) for ax in fig.axes] == [4, 6, 0]
    colours = [ln.get_color() for ax in fig.axes for ln in ax.get_lines()]
    assert len(set(colours)) == len(colours)  # no colour shared by two series
    _legends_outside(fig)
    assert main(["bench", "report", "--out", str(tmp_path)]) == 2  # no JSON there yet
    path = tmp_path / "bench_serve_x.json"
    path.write_text(json.dumps(serve))
    assert plots.main([str(path)]) == 0
    assert (tmp_path / "bench_serve_x.png").read_bytes()[:4] == PNG_MAGIC


def test_device_title():
    from benchmarks.plots import device_title
    assert device_title("cpu-2c-amd-epyc-avx512") == "2-core AMD EPYC, AVX-512"
    assert device_title("cpu-2c-amd-epyc-avx2") == "2-core AMD EPYC, AVX2"
    assert device_title("cpu-2c-amd-epyc") == "2-core AMD EPYC, AVX-512"  # named before the ISA
    assert device_title("cpu-2c-intel-r-xeon-r-processor") == "2-core Intel(R) Xeon(R) Processor"
    assert device_title("gpu-nvidia-h100-80gb-hbm3") == "NVIDIA H100 80GB HBM3"


def test_ops_cuda_rows_skip_with_reason_on_cpu(monkeypatch):
    from benchmarks import ops_bench
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    rows, why = ops_bench.gpu_rows(quick=True, repeats=1)
    assert rows == [] and why.startswith("skipped: no CUDA device")


def test_models_notes_say_why_not_run():
    from benchmarks.models_bench import compile_notes, skipped
    rows = [{"backend": "compile", "error": "BackendCompilerFailed: no C++ compiler"},
            {"backend": "compile", "p50_ms": 1.0}, {"backend": "eager", "p50_ms": 1.0}]
    assert compile_notes(rows) == ["torch.compile failed on 1 of 2 models: "
                                   "BackendCompilerFailed: no C++ compiler"]
    assert compile_notes(rows[1:])[0].startswith("torch.compile: inductor")
    assert skipped(["eager", "onnxruntime"], ["fp32", "bf16"]) == [
        "onnxruntime bf16: not run (the ONNX export is fp32; onnxruntime runs it as exported)"]


@pytest.mark.parametrize("argv, message", [
    (["models", "--models", "vit_huge"], "unknown model family vit_huge"),
    (["models", "--batches", "1,x"], "not a comma-separated list of integers"),
    (["models", "--batches", "0"], "need positive integers"),
    (["models", "--backends", "tensorflow"], "unknown backend tensorflow"),
    (["models", "--variants", "plain,irpe_x"], "unknown variant irpe_x"),
    (["serve", "--concurrency", "-1"], "need positive integers"),
    (["models", "--detr-sizes", "480"], "not a comma-separated list of HxW sizes"),
])
def test_bad_input_one_line_exit_2(argv, message, capsys, tmp_path):
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("irpe bench: error: ") and message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_report_without_json_exits_2(tmp_path, capsys):
    assert main(["bench", "report", "--out", str(tmp_path)]) == 2
    assert "no bench_*.json" in capsys.readouterr().err


def test_models_variants_filter_and_timm_twin(monkeypatch):
    """`--variants` keeps the named variants of a family; "timm" adds timm's own plain DeiT
    (random weights, the logits module) only where timm imports (`make gpu-check` asks for it:
    the GPU image has timm, this project does not depend on it)."""
    import sys
    import types

    import torch

    from benchmarks import models_bench as mb
    assert list(mb.variants("deit_small", ["plain", "irpe_qkv"])) == ["plain", "irpe_qkv"]
    assert "timm" not in mb.variants("deit_small")  # never by default
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ImportError
    assert list(mb.variants("deit_small", ["plain", "timm"])) == ["plain"]
    made = []
    fake = types.SimpleNamespace(create_model=lambda name, pretrained: made.append(
        (name, pretrained)) or torch.nn.Linear(2, 3))
    monkeypatch.setitem(sys.modules, "timm", fake)
    got = mb.variants("deit_small", ["plain", "irpe_k", "timm"])
    assert got["timm"] == "timm:deit_small_patch16_224" and list(got)[-1] == "timm"
    assert "timm" not in mb.variants("detr_small", ["plain", "timm"])  # DeiT families only
    module = mb._torch_module(got["timm"], "cpu")
    assert made == [("deit_small_patch16_224", False)]
    assert module(torch.ones(1, 2)).shape == (1, 3)
