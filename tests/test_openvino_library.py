"""The iRPE OpenVINO library (plugins/openvino, ``make ov-ops``) on the real CPU plugin: a
DeiT's attention blocks run as one RPEAttention each and equal the frontend conversions and
PyTorch, independent of the thread count; an int8 IR keeps the library's attention and reads
back only with the library (one line otherwise); modes and library files checked in one line;
the ops equal numpy and refuse shapes that cannot match in one line; a served model on the
library answers as on the conversions. (Every method x term and DETR at several sizes on the
library: tests/test_openvino_runtime.py, parametrised over both paths.)"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from export.validate import TOLERANCES
from irpe.artifact.contract import QUANTIZATION_KEY
from irpe.artifact.openvino_ir import library_ops, read_ir_props
from irpe.cli import main
from irpe.runtime.openvino.library import OvLibraryError, set_attention_precision
from irpe.runtime.openvino.session import OvOptions, compile_model, open_model, read_model
from serve.config import ServeSettings
from tests.helpers import export_tiny_qkv, running_server, shape_png
from tests.openvino_common import cpu_has_bf16, needs_openvino, run_compiled

pytestmark = needs_openvino

FP32 = TOLERANCES["fp32"]
SAME = 1e-5  # the library's attention against the conversions: own GEMM order and exp
OFF = OvOptions(threads=1, ops="off")


def _on(library, threads: int = 1) -> OvOptions:
    return OvOptions(threads=threads, ops="on", library=str(library))


@pytest.fixture(scope="module")
def qkv(tmp_path_factory):
    """tiny_deit with iRPE on q, k and v: (model, spec, onnx path, weights path)."""
    return export_tiny_qkv(tmp_path_factory.mktemp("ov_library"))


def _images(batch: int = 3) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((batch, 3, 40, 40)).astype(np.float32)


def test_attention_blocks_run_as_one_library_op_each(qkv, ov_library):
    model, _, path, _ = qkv
    blocks = sum(n.op_type == "Softmax" for n in onnx.load(path).graph.node)
    compiled, line = compile_model(path, _on(ov_library))
    assert f"iRPE ops: library libirpe_openvino.so ({blocks} attention blocks fused)" in line
    types = [op.get_type_name() for op in read_model(path, _on(ov_library)).get_ops()]
    assert types.count("RPEAttention") == blocks and "Softmax" not in types
    assert "ScatterElementsUpdate" not in types
    x = _images()
    got = run_compiled(compiled, images=x)["logits"]
    want = run_compiled(compile_model(path, OFF)[0], images=x)["logits"]
    np.testing.assert_allclose(got, want, atol=SAME, rtol=SAME)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, ref, atol=FP32[0], rtol=FP32[1])


def test_auto_takes_the_library_where_it_wins(qkv, ov_library, tmp_path):
    """auto: fused blocks where there are iRPE terms (their products in bf16 at bf16);
    OpenVINO's own attention for a plain file; on: the library whatever the file."""
    from export.onnx import export_onnx
    from irpe import RPEConfig
    from tests.helpers import tiny_deit
    auto = OvOptions(threads=1, library=str(ov_library))
    assert "attention blocks fused)" in compile_model(qkv[2], auto)[1]
    plain, spec = tiny_deit(None)
    plain_path = export_onnx(plain, tmp_path / "plain.onnx", spec=spec)
    line = compile_model(plain_path, auto)[1]
    assert line.endswith("converted at load (Gather, ScatterElementsUpdate) (OpenVINO's own "
                         "kernels win for this file)"), line
    assert compile_model(plain_path, _on(ov_library))[1].endswith("library libirpe_openvino.so")
    if cpu_has_bf16():  # bf16 too, now that the library's products run in bf16
        k_only, spec = tiny_deit(RPEConfig(ratio=1.9, method="product", mode="ctx", skip=1,
                                           on="k"))
        k_path = export_onnx(k_only, tmp_path / "k.onnx", spec=spec)
        for path in (k_path, qkv[2]):
            model, _, how = open_model(path, auto.with_(precision="bf16"))
            assert "attention blocks fused, products in bf16)" in how
            assert {op.get_attributes()["precision"] for op in model.get_ops()
                    if op.get_type_name() == "RPEAttention"} == {"bf16"}
        assert "attention blocks fused)" in compile_model(k_path, auto)[1]


@pytest.mark.parametrize("simd", ["avx2", "portable"])
def test_the_narrower_vector_paths_agree(qkv, ov_library, monkeypatch, simd):
    """The kernel's AVX2 and portable rows (an AVX2-only CPU, or none), capped by
    $IRPE_ORT_SIMD, which the ops read on every run: equal to the conversions."""
    path, x = qkv[2], _images()
    compiled = compile_model(path, _on(ov_library))[0]
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    got = run_compiled(compiled, images=x)["logits"]
    want = run_compiled(compile_model(path, OFF)[0], images=x)["logits"]
    np.testing.assert_allclose(got, want, atol=SAME, rtol=SAME)


def _cpu_flag(flag: str) -> bool:
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        return any(flag in line.split() for line in info if line.startswith("flags"))


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """An odd token count (8 x 8 + cls = 65) and a head dim of 24 (not a multiple of 16): the
    bf16 pairs' and the vectors' padding. (model, spec, onnx path, None) like ``qkv``."""
    from export.onnx import export_onnx
    from irpe import RPEConfig
    from tests.helpers import tiny_deit
    model, spec = tiny_deit(RPEConfig(ratio=1.9, method="product", mode="ctx", skip=1,
                                      on="qkv"), img_size=64, embed_dim=48)
    folder = tmp_path_factory.mktemp("ov_library_odd")
    return model, spec, export_onnx(model, folder / "odd.onnx", spec=spec), None


@pytest.mark.parametrize("which", ["qkv", "odd"])
def test_bf16_products_stay_near_float32_and_fall_back_without_bf16(request, ov_library,
                                                                    monkeypatch, which):
    """precision bf16 (bf16 and int8 models): q k^T, p v and the iRPE tables in bf16 with
    float32 sums where the CPU has AVX512_BF16, within the bf16 tolerance of float32 and
    PyTorch; elsewhere (or capped by $IRPE_ORT_SIMD) the float32 path, bit for bit."""
    model, spec, path, _ = request.getfixturevalue(which)
    size = spec.preprocess["size"]
    x = np.random.default_rng(1).standard_normal((3, 3, size, size)).astype(np.float32)
    f32 = run_compiled(compile_model(path, _on(ov_library))[0], images=x)["logits"]
    m, ov_core, _ = open_model(path, _on(ov_library))
    assert set_attention_precision(m, "int8") > 0
    got = run_compiled(ov_core.compile_model(m, "CPU", _on(ov_library).config()),
                       images=x)["logits"]
    bf16 = TOLERANCES["bf16"]
    np.testing.assert_allclose(got, f32, atol=bf16[0], rtol=bf16[1])
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, ref, atol=bf16[0], rtol=bf16[1])
    ran_bf16 = _cpu_flag("avx512_bf16") and _cpu_flag("avx512bw")
    assert np.array_equal(got, f32) is not ran_bf16
    monkeypatch.setenv("IRPE_ORT_SIMD", "avx2")  # read on every run: the float32 AVX2 rows
    compiled = ov_core.compile_model(m, "CPU", _on(ov_library).config())
    avx2 = run_compiled(compile_model(path, _on(ov_library))[0], images=x)["logits"]
    assert np.array_equal(run_compiled(compiled, images=x)["logits"], avx2)


@pytest.mark.parametrize("which, batch", [("qkv", 5), ("odd", 1)])
def test_results_do_not_depend_on_the_thread_count(request, ov_library, which, batch):
    """One writer per row: bit-identical for 1 and 2 threads, also where one pair's queries
    are split between tasks (batch 1, 2 heads, 65 tokens) and the Q term is made by key."""
    _, spec, path, _ = request.getfixturevalue(which)
    size = spec.preprocess["size"]
    x = np.random.default_rng(2).standard_normal((batch, 3, size, size)).astype(np.float32)
    one = run_compiled(compile_model(path, _on(ov_library, 1))[0], images=x)["logits"]
    two = run_compiled(compile_model(path, _on(ov_library, 2))[0], images=x)["logits"]
    assert np.array_equal(one, two)


def test_int8_ir_keeps_the_library_attention_and_needs_the_library(qkv, ov_library, tmp_path,
                                                                   monkeypatch, capsys):
    pytest.importorskip("nncf")
    path = qkv[2]
    monkeypatch.setenv("IRPE_OV_OPS", "on")
    monkeypatch.setenv("IRPE_OV_OPS_LIBRARY", str(ov_library))
    out = tmp_path / "q.int8.xml"
    assert main(["quantize", str(path), "-o", str(out), "--target", "openvino",
                 "--calibration", "shapes", "--samples", "8"]) == 0
    capsys.readouterr()
    assert library_ops(out) == ["RPEAttention"]
    record = json.loads(read_ir_props(out)[QUANTIZATION_KEY])
    assert record["irpe_ops"].startswith("library libirpe_openvino.so"), record
    assert record["attention_precision"] == "bf16"  # calibrated and stored as it runs
    assert {op.get_attributes()["precision"] for op in read_model(out, _on(ov_library)).get_ops()
            if op.get_type_name() == "RPEAttention"} == {"bf16"}
    compiled, line = compile_model(out, _on(ov_library))
    products = "products in bf16" if cpu_has_bf16() else "products in float32: no BF16 on this CPU"
    assert line.endswith(f"iRPE ops: library libirpe_openvino.so ({products})"), line
    x = _images()
    got = run_compiled(compiled, images=x)["logits"]
    fp32 = run_compiled(compile_model(path, OFF)[0], images=x)["logits"]
    assert got.shape == fp32.shape and np.isfinite(got).all()
    assert np.abs(got - fp32).max() < 0.5 * np.abs(fp32).max()  # int8, near the fp32 answer
    with pytest.raises(OvLibraryError) as err:
        compile_model(out, OFF)
    message = str(err.value)
    assert "\n" not in message and "holds the iRPE OpenVINO library's ops (RPEAttention)" in \
        message and "make ov-ops builds it" in message
    monkeypatch.setenv("IRPE_OV_OPS", "off")  # irpe eval: one line, exit 2
    assert main(["eval", str(out), "--data", "shapes", "--shapes-val", "4"]) == 2
    err_line = capsys.readouterr().err.strip()
    assert "\n" not in err_line and "make ov-ops builds it" in err_line, err_line


def test_an_attention_precision_other_than_f32_or_bf16_is_one_line(qkv, ov_library, tmp_path):
    from irpe.runtime.graph.rewrites import fuse_proto
    proto = onnx.load(qkv[2])
    assert fuse_proto(proto).attention > 0
    for node in proto.graph.node:
        if node.op_type == "RPEAttention":
            node.attribute.append(helper.make_attribute("precision", "fp8"))
    bad = tmp_path / "fp8.onnx"
    onnx.save(proto, bad)
    with pytest.raises(ValueError) as err:
        compile_model(bad, _on(ov_library))
    message = str(err.value)
    assert "\n" not in message and "precision must be f32 or bf16, got fp8" in message, message


def test_modes_and_library_files_are_checked_in_one_line(qkv, tmp_path, monkeypatch, caplog):
    path = qkv[2]
    with pytest.raises(ValueError, match="openvino ops mode must be auto, on or off, got 'maybe'"):
        OvOptions(ops="maybe")
    monkeypatch.setenv("IRPE_OV_OPS", "sometimes")
    with pytest.raises(ValueError, match="IRPE_OV_OPS='sometimes': openvino ops mode"):
        OvOptions.from_env()
    missing = tmp_path / "none.so"
    with pytest.raises(OvLibraryError, match=r"required but .*none\.so not built \(make ov-ops\)"):
        compile_model(path, OvOptions(ops="on", library=str(missing)))
    bogus = tmp_path / "bogus.so"
    bogus.write_text("not a shared library")
    with pytest.raises(OvLibraryError, match=r"bogus\.so does not load: ") as err:
        compile_model(path, OvOptions(ops="on", library=str(bogus)))
    assert "\n" not in str(err.value)
    with caplog.at_level(logging.WARNING, logger="irpe.runtime.openvino"):
        _, line = compile_model(path, OvOptions(threads=1, library=str(bogus)))  # auto
    assert re.search(r"converted at load .*bogus\.so does not load\)$", line), line
    assert any("does not load" in r.getMessage() for r in caplog.records)


def _one_op_model(folder, op: str, data_shape, index_shape=("a", "b"), num_buckets: int = 0):
    """A graph of one irpe op on inputs ``data`` (float) and ``index`` (int64)."""
    attrs = {"num_buckets": num_buckets} if num_buckets else {}
    node = helper.make_node(op, ["data", "index"], ["out"], domain="irpe", **attrs)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("data", TensorProto.FLOAT, data_shape),
                        helper.make_tensor_value_info("index", TensorProto.INT64,
                                                      list(index_shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("irpe", 1)])
    path = folder / f"{op}_{len(list(folder.iterdir()))}.onnx"
    onnx.save(model, path)
    return path


def test_the_ops_equal_numpy_and_refuse_mismatched_shapes_in_one_line(tmp_path, ov_library):
    """Ids outside [0, K) gather 0 and are dropped from the sums (the export contract). Shapes
    that cannot match are refused when the file is read; a mismatch only the run can see
    (hand-made graphs with an index input) is not caught: exported files hold the index as a
    constant of the attention's own size."""
    rng = np.random.default_rng(2)
    attn = rng.random((2, 2, 3, 4), dtype=np.float32)
    index = rng.integers(-1, 6, (3, 4))  # -1 and 5 are outside the 5 buckets
    inside = (index >= 0) & (index < 5)
    scatter = compile_model(_one_op_model(tmp_path, "RPEScatter", ["B", "H", "Q", "L"],
                                          num_buckets=5), _on(ov_library))[0]
    want = np.zeros((2, 2, 3, 5), np.float32)
    for i, j in zip(*np.nonzero(inside), strict=True):
        want[:, :, i, index[i, j]] += attn[:, :, i, j]
    got = run_compiled(scatter, data=attn, index=index)["out"]
    np.testing.assert_allclose(got, want, atol=1e-6)
    gather = compile_model(_one_op_model(tmp_path, "RPEGather", ["B", "H", "R", "K"]),
                           _on(ov_library))[0]
    table = rng.random((2, 2, 3, 5), dtype=np.float32)
    got = run_compiled(gather, data=table, index=index)["out"]
    picked = np.take_along_axis(table, np.broadcast_to(np.where(inside, index, 0),
                                                       (2, 2, 3, 4)), axis=3)
    np.testing.assert_array_equal(got, np.where(inside, picked, 0))
    for op, data, idx, message in [
            ("RPEScatter", [1, 2, 3, 4], [3, 5], r"RPEScatter: attn must be \[B, H, Lq, Lk\]"),
            ("RPEGather", [1, 1, 3, 5], [2, 4], r"RPEGather: table must be \[B, H, Lq or 1, K\]")]:
        bad = _one_op_model(tmp_path, op, data, idx, num_buckets=5 if op == "RPEScatter" else 0)
        with pytest.raises(ValueError, match=message) as err:
            compile_model(bad, _on(ov_library))
        assert "\n" not in str(err.value)


def test_a_served_model_on_the_library_answers_as_on_the_conversions(qkv, ov_library):
    path = str(qkv[2])
    ov = {"backend": "openvino", "path": path}
    models = [{"name": "lib", "ov_ops": "on", "ov_ops_library": str(ov_library), **ov},
              {"name": "conv", "ov_ops": "off", **ov}]
    settings = ServeSettings(threads=1, log_level="warning", models=models)
    files = [("file", (f"{i}.png", shape_png(i, 40))) for i in range(3)]
    with running_server(settings) as base, httpx.Client(base_url=base, timeout=30) as client:
        lib = client.post("/v1/models/lib/classify?top_k=4", files=files)
        conv = client.post("/v1/models/conv/classify?top_k=4", files=files)
    assert lib.status_code == conv.status_code == 200, (lib.text, conv.text)
    for x, y in zip(lib.json()["results"], conv.json()["results"], strict=True):
        assert x["indices"] == y["indices"]
        assert np.allclose(x["scores"], y["scores"], atol=1e-5)


BUILD = Path(__file__).resolve().parents[1] / "plugins" / "openvino" / "build.sh"
SKIP_TAIL = "; OpenVINO runs the iRPE nodes through the frontend conversions"


def _build(tmp_path, optional: bool, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("CXX", "MAKEFLAGS")}
    args = ["bash", str(BUILD), *(["--optional"] if optional else []), str(tmp_path / "cmake")]
    return subprocess.run(args, env={**base, "IRPE_OV_OUTPUT_DIR": str(tmp_path / "out"), **env},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", ["no openvino", "no compiler"])
def test_the_build_says_why_it_cannot_run_in_one_line(tmp_path, case):
    """--optional (make ov-ops, make run): one skip line, exit 0; else one line, exit 2."""
    env = ({"PYTHON": str(tmp_path / "no-python")} if case == "no openvino" else
           {"PYTHON": sys.executable, "CXX": str(tmp_path / "no-such-c++")})
    done = _build(tmp_path, optional=True, **env)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("ov-ops: skipped, ") and line.endswith(SKIP_TAIL), line
    if case == "no openvino":
        assert "the openvino package (with its CMake config) is not installed for" in line
    elif shutil.which("cmake"):
        assert f"C++ compiler CXX={tmp_path / 'no-such-c++'} not found" in line
    failed = _build(tmp_path, optional=False, **env)
    assert failed.returncode == 2 and failed.stdout == "" and \
        len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert not (tmp_path / "out").exists()
