"""Exported models on the ORT custom-op library vs the files' own functions vs PyTorch: every
method x bias/contextual x Q/K/V on 2-block DeiTs, DETR at three resolutions from one file,
`irpe validate` and serve's onnxruntime backend on the library path."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.onnx import export_onnx
from irpe import RPEConfig, create_model, save_checkpoint
from irpe.artifact.trained import default_spec, save_trained
from irpe.cli import main
from irpe.models import pad_images
from tests.helpers import TINY, env_session, run_python, tiny_deit

pytestmark = pytest.mark.usefixtures("ort_library_env")  # fixtures: tests/conftest.py

CASES = [(method, mode, on) for method in ("euc", "quant", "product", "cross")
         for mode in ("bias", "ctx") for on in ("q", "k", "v")
         if not (mode == "bias" and on == "v")]


def _profiled_ops(session: ort.InferenceSession) -> set:
    """op_name of every node event in the session's profile (ends profiling)."""
    with open(session.end_profiling()) as f:
        return {e["args"].get("op_name") for e in json.load(f) if e.get("cat") == "Node"}


def _profiled_session(path):
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(path.parent / "ort_profile")  # not the working directory
    options.register_custom_ops_library(os.environ["IRPE_ORT_OPS_LIBRARY"])
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("method,mode,on", CASES)
def test_every_variant_custom_ops_vs_functions_vs_torch(ort_library, tmp_path, monkeypatch,
                                                        method, mode, on):
    cfg = RPEConfig(ratio=1.9, method=method, mode=mode, shared_head=True, skip=1, on=on)
    model, spec = tiny_deit(cfg)
    path = export_onnx(model, tmp_path / "m.onnx", spec=spec)
    x = torch.randn(3, 3, 40, 40)
    with torch.no_grad():
        ref = model(x).numpy()
    custom_session, ops = env_session(path, custom_ops="on")
    custom = custom_session.run(None, {"images": x.numpy()})[0]
    functions = env_session(path, custom_ops="off")[0].run(None, {"images": x.numpy()})[0]
    np.testing.assert_allclose(custom, ref, atol=1e-4, rtol=1e-4)
    assert np.abs(custom - functions).max() <= 1e-5
    if on == "v":  # the scatter sums in another order than the one-hot MatMul
        assert ops.fused_v == 2 and ops.fused_softmax == 0  # no gather term to fuse with
    else:  # gathers copy: without the Softmax fusion (own exp) the path is the functions'
        # 2 blocks: Softmax(RPEGatherAdd) as one node; bias tables are constants folded at
        # export (no RPE node), cross adds its two gathers before the logits (left unfused)
        assert ops.fused_softmax == (2 if mode == "ctx" and method != "cross" else 0)
        # and then each block as one RPEAttention (irpe.runtime.graph.rewrite_attention)
        assert ops.attention == ops.fused_softmax
        monkeypatch.setenv("IRPE_ORT_FUSE", "gather,scatter")
        exact = env_session(path, custom_ops="on")[0].run(None, {"images": x.numpy()})[0]
        assert np.array_equal(exact, functions)
    if mode == "ctx":  # the library's kernels ran, not the inlined functions
        profiled = _profiled_session(path)
        profiled.run(None, {"images": x.numpy()})
        seen = _profiled_ops(profiled)
        assert ("RPEScatter" if on == "v" else "RPEGather") in seen


def test_detr_one_file_three_resolutions(ort_library, tmp_path):
    torch.manual_seed(3)
    model = create_model("detr_tiny_irpe").eval()
    save_checkpoint(model, str(tmp_path / "w.safetensors"))
    path = export_onnx("detr_tiny_irpe", tmp_path / "d.onnx",
                       checkpoint=str(tmp_path / "w.safetensors"))
    custom, ops = env_session(path, custom_ops="on", threads=2)
    assert ops.attention == 0  # separate q/k/v projections: not the pattern RPEAttention takes
    functions, _ = env_session(path, custom_ops="off")
    for height, width in [(96, 160), (128, 128), (75, 201)]:
        images, sizes = pad_images([torch.randn(3, height, width),
                                    torch.randn(3, height // 2, width - 20)])
        feeds = {"images": images.numpy(), "sizes": sizes.numpy()}
        got, want = custom.run(None, feeds), functions.run(None, feeds)
        with torch.no_grad():
            ref = model(images, sizes)
        for g, w, r in zip(got, want, (ref["pred_logits"], ref["pred_boxes"]), strict=True):
            assert np.array_equal(g, w)  # DETR has iRPE-K only: gathers, bit-identical
            np.testing.assert_allclose(g, r.numpy(), atol=1e-4, rtol=1e-4)


def test_plain_deit_attention_runs_as_one_op(ort_library, tmp_path, monkeypatch):
    """Without iRPE the attention blocks still become RPEAttention (no terms): the kernel the
    benchmark's plain_ops row times; IRPE_ORT_FUSE without "attention" leaves them alone."""
    model = create_model("deit_tiny_patch16_224", **TINY).eval()  # no rpe_config: plain
    path = export_onnx(model, tmp_path / "p.onnx",
                       spec=default_spec("deit_tiny_patch16_224", **TINY))
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        ref = model(x).numpy()
    session, ops = env_session(path, custom_ops="on", threads=2)
    assert ops.attention == 2 and "2 attention blocks fused" in ops.describe()
    np.testing.assert_allclose(session.run(None, {"images": x.numpy()})[0], ref, atol=1e-4,
                               rtol=1e-4)
    monkeypatch.setenv("IRPE_ORT_FUSE", "qlayout,gather,scatter,softmax")
    assert env_session(path, custom_ops="on")[1].attention == 0


@pytest.fixture(scope="module")
def qkv_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("qkv")
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    model, spec = tiny_deit(cfg)
    save_trained(model, str(d / "m.safetensors"), spec)
    return export_onnx(str(d / "m.safetensors"), d / "m.onnx"), d / "m.safetensors"


def test_irpe_validate_compares_custom_ops_functions_and_torch(ort_library, qkv_file, capsys):
    path, _ = qkv_file
    assert main(["validate", str(path), "-n", "4", "--runtime", "onnxruntime",
                 "--custom-ops", "on"]) == 0
    out = capsys.readouterr().out
    assert "iRPE ops: custom-op library" in out and "PASS" in out
    line = next(x for x in out.splitlines() if "custom ops vs functions" in x)
    assert float(line.rsplit("logits", 1)[1]) <= 1e-5
    assert main(["validate", str(path), "-n", "2", "--runtime", "onnxruntime",
                 "--custom-ops", "off"]) == 0
    assert "iRPE ops: ONNX functions (custom ops off" in capsys.readouterr().out


def test_irpe_validate_required_library_missing(qkv_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IRPE_ORT_OPS_LIBRARY", str(tmp_path / "missing.so"))
    path, _ = qkv_file
    assert main(["validate", str(path), "-n", "2", "--runtime", "onnxruntime",
                 "--custom-ops", "on"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("irpe validate: error: no custom-op library at") and \
        len(err.strip().splitlines()) == 1


def test_serve_backend_uses_the_library_and_logs_it(ort_library, qkv_file, caplog):
    from serve.backends import create_backend
    from serve.config import ModelConfig
    path, _ = qkv_file
    images = np.random.default_rng(0).standard_normal((2, 3, 40, 40), dtype=np.float32)
    outputs = {}
    for mode in ("on", "off"):
        cfg = ModelConfig(name="m", path=path, backend="onnxruntime", ort_custom_ops=mode,
                          ort_ops_library=ort_library)
        backend = create_backend(cfg, threads=1)
        with caplog.at_level(logging.INFO, logger="irpe.serve"):
            backend.load()
        assert backend.file.ops.custom_ops == (mode == "on")
        outputs[mode] = backend.infer(images, None)["logits"]
    assert np.abs(outputs["on"] - outputs["off"]).max() <= 1e-5
    logged = [r.irpe_ops for r in caplog.records if hasattr(r, "irpe_ops")]
    assert logged[0].startswith("iRPE ops: custom-op library") and "functions" in logged[1]


def test_serve_backend_required_library_missing(qkv_file, tmp_path):
    """ort_custom_ops: on without the library: the load fails with one clear error (the server
    marks that model failed, 503); auto serves through the functions."""
    from irpe.runtime.onnxruntime.session import CustomOpsError
    from serve.backends import create_backend
    from serve.config import ModelConfig
    path, _ = qkv_file
    cfg = ModelConfig(name="m", path=path, backend="onnxruntime", ort_custom_ops="on",
                      ort_ops_library=tmp_path / "gone.so")
    with pytest.raises(CustomOpsError, match="no custom-op library at .*gone.so"):
        create_backend(cfg).load()
    backend = create_backend(cfg.model_copy(update={"ort_custom_ops": "auto"}))
    backend.load()
    assert not backend.file.ops.custom_ops
    images = np.zeros((1, 3, 40, 40), np.float32)
    assert backend.infer(images, None)["logits"].shape == (1, 10)


def test_export_benchmark_custom_op_rows(ort_library, tmp_path):
    """benchmarks.export_ort times the library's sessions beside the function ones."""
    done = run_python(["-m", "benchmarks.export_ort", "--quick", "--out", str(tmp_path)],
                      env=dict(os.environ, IRPE_ORT_OPS_LIBRARY=str(ort_library)))
    assert done.returncode == 0, done.stderr[-2000:]  # own process: the pool is process-wide
    data = json.loads((tmp_path / "export_ort.json").read_text())
    assert set(data["results"]) == {"plain", "plain_ops", "irpe_k", "irpe_k_ops"}
    assert data["results"]["irpe_k_ops"]["goal"] == 0.98
    rows = data["results"]  # the library's rows also against plain with the library
    assert rows["irpe_k_ops"]["ratio_to_plain_ops"] == pytest.approx(
        rows["plain_ops"]["median_ms"] / rows["irpe_k_ops"]["median_ms"])
    assert rows["irpe_k"]["ratio_to_plain_ops"] is None
    assert data["custom_op_library"] == str(ort_library)
    assert "| irpe_k_ops | deit_tiny_patch16_224_ctx_product_50_shared_k |" in \
        (tmp_path / "export_ort.md").read_text()


def test_k_and_q_terms_fused_into_one_node_stay_bit_identical(ort_library, tmp_path,
                                                              monkeypatch):
    """iRPE on Q and K: both logits terms run as one RPEGatherAdd2 per block (bit-identical
    without the Softmax fusion, which has its own exp)."""
    monkeypatch.setenv("IRPE_ORT_FUSE", "gather,scatter")
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=False, skip=1, on="qk")
    model, spec = tiny_deit(cfg)
    path = export_onnx(model, tmp_path / "m.onnx", spec=spec)
    x = np.random.default_rng(5).standard_normal((3, 3, 40, 40), dtype=np.float32)
    custom, ops = env_session(path, custom_ops="on", threads=2)
    assert ops.fused == 4  # 2 blocks x (K, Q)
    functions, _ = env_session(path, custom_ops="off")
    assert np.array_equal(custom.run(None, {"images": x})[0],
                          functions.run(None, {"images": x})[0])


def test_benchmark_attention_blocks_cut_from_exported_files(ort_library, qkv_file):
    """benchmarks.export_ort's block rows: block 0's attention cut out of an exported file runs
    stock, as one RPEAttention, and as the fused ops without it, all with the same output."""
    from benchmarks import export_ort
    path, _ = qkv_file
    blocks = export_ort.attention_blocks({"irpe_qkv": path})
    (key, graph), = blocks.items()
    assert key == "attention block, iRPE-QKV: exported nodes (ours)"
    x = np.random.default_rng(0).standard_normal((2, 26, 3, 2, 16), dtype=np.float32)
    feeds = {export_ort.BLOCK_IO[0]: x}
    stock = export_ort._session(graph, 1, None).run(None, feeds)[0]
    assert stock.shape == (2, 26, 2, 16)
    for stages, op in (("1", "RPEAttention"),
                       (export_ort.SESSION4_STAGES, "RPEGatherAdd2SoftmaxScatter")):
        session = export_ort._session(graph, 2, ort_library, stages)
        np.testing.assert_allclose(session.run(None, feeds)[0], stock, rtol=1e-5, atol=1e-5)
        assert op in _fused_ops(graph, stages)


def _fused_ops(graph: bytes, stages: str) -> set:
    import onnx

    from irpe.runtime.graph.rewrites import fuse_model, parse_stages
    fused, _ = fuse_model(graph, parse_stages(stages))
    return {n.op_type for n in onnx.load_from_string(fused).graph.node}
