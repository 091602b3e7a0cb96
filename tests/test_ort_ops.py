"""ONNX Runtime custom-op library (plugins/onnxruntime): built with CMake against the ORT headers,
loaded into the installed onnxruntime; op results against PyTorch's irpe ops and the files' own
functions (1 and 2 threads), on-the-fly ids, bad attributes / inputs / libraries.

The library build needs the ORT C/C++ headers: ORT_ROOT / ONNXRUNTIME_ROOT or, in CI,
../shared/third_party/onnxruntime-1.23. Without them the tests skip, except under CI=true.
Model-level tests: tests/test_ort_ops_models.py."""
from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from irpe import bucket_ids, rpe_gather, rpe_scatter
from irpe.runtime.onnxruntime.session import CustomOpsError
from tests.helpers import ORT_ATTRS as ATTRS
from tests.helpers import ORT_SOURCE as SOURCE
from tests.helpers import build_ort_library as _build
from tests.helpers import env_session
from tests.helpers import ort_headers as headers
from tests.helpers import ort_op_model as op_model
from tests.ort_cases import add_model, gather_graph_model, layer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("ort_library_env")  # fixtures: tests/conftest.py


def run(model: bytes, mode: str, threads: int = 1, **feeds) -> np.ndarray:
    session, path = env_session(model, threads=threads, custom_ops=mode)
    assert path.custom_ops == (mode == "on")
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_bit_identical_to_functions_and_torch(ort_library, index_dtype):
    ids, table, _ = layer()
    ids = ids.astype(index_dtype)
    model = op_model("RPEGather", index=helper.np_dtype_to_tensor_dtype(ids.dtype),
                     num_buckets=50, **ATTRS)
    custom = run(model, "on", 2, x=table, index=ids)
    assert np.array_equal(custom, run(model, "off", x=table, index=ids))
    ref = rpe_gather(torch.from_numpy(table), torch.from_numpy(ids)).numpy()
    assert np.array_equal(custom, ref)
    assert np.array_equal(custom, run(model, "on", 1, x=table, index=ids))


def test_gather_one_row_transposed_q_table(ort_library):
    """The exporter's iRPE-Q form: table [B,H,1,L*K], index j*K + id(j,i) -> transposed term."""
    ids, table, _ = layer()
    length, k = ids.shape[0], table.shape[3]
    flat = (ids + np.arange(length)[:, None] * k).T.copy()
    row = table.reshape(2, 3, 1, length * k)
    model = op_model("RPEGather", num_buckets=length * k, **ATTRS)
    custom = run(model, "on", 2, x=row, index=flat)
    assert np.array_equal(custom, run(model, "off", x=row, index=flat))
    direct = rpe_gather(torch.from_numpy(table), torch.from_numpy(ids)).transpose(2, 3)
    assert np.array_equal(custom, direct.numpy())


@pytest.mark.parametrize("threads", [1, 2])
def test_scatter_equals_torch(ort_library, threads):
    """Sums in ascending key order per bucket: PyTorch's scatter_add_ bit for bit (goal <= 1e-6)."""
    ids, _, attn = layer()
    model = op_model("RPEScatter", num_buckets=50, **ATTRS)
    custom = run(model, "on", threads, x=attn, index=ids)
    ref = rpe_scatter(torch.from_numpy(attn), torch.from_numpy(ids), 50).numpy()
    assert np.array_equal(custom, ref)
    assert np.abs(custom - run(model, "off", x=attn, index=ids)).max() <= 1e-6
    again = run(model, "on", 3 - threads, x=attn, index=ids)
    assert np.array_equal(custom, again)  # no dependence on the thread count


def test_float16_both_ops(ort_library):
    ids, table, attn = layer()
    gather = op_model("RPEGather", TensorProto.FLOAT16, num_buckets=50, **ATTRS)
    t16 = table.astype(np.float16)
    assert np.array_equal(run(gather, "on", 2, x=t16, index=ids),
                          run(gather, "off", x=t16, index=ids))
    scatter = op_model("RPEScatter", TensorProto.FLOAT16, num_buckets=50, **ATTRS)
    a16 = attn.astype(np.float16)
    got = run(scatter, "on", 2, x=a16, index=ids)
    ref = rpe_scatter(torch.from_numpy(a16), torch.from_numpy(ids), 50).numpy()
    assert got.dtype == np.float16 and np.array_equal(got, ref)  # fp32 sums, one rounding


def test_out_of_range_ids_follow_the_kernel_contract(ort_library):
    """Gather writes 0, scatter drops the value (as the CUDA kernels; never a wild access)."""
    ids, table, attn = layer()
    bad = ids.copy()
    bad[0, :3] = [-1, 50, 10 ** 9]
    got = run(op_model("RPEGather", num_buckets=50, **ATTRS), "on", x=table, index=bad)
    assert (got[:, :, 0, :3] == 0).all() and np.array_equal(got[:, :, 1:], run(
        op_model("RPEGather", num_buckets=50, **ATTRS), "on", x=table, index=ids)[:, :, 1:])
    sums = run(op_model("RPEScatter", num_buckets=50, **ATTRS), "on", x=attn, index=bad)
    assert np.allclose(sums[:, :, 0].sum(-1), attn[:, :, 0, 3:].sum(-1), atol=1e-5)


@pytest.mark.parametrize("method,height,width,skip", [("product", 4, 6, 1), ("euc", 5, 3, 0),
                                                      ("cross_rows", 3, 7, 1)])
def test_on_the_fly_ids_equal_the_index_form(ort_library, method, height, width, skip):
    """The *Grid forms (method/ratio/skip, as the TensorRT creators): ids computed by
    irpe_bucket.h from input 1's (H, W)."""
    ratio = 1.9
    ids = bucket_ids(method, ratio, height, width, skip=skip).numpy()
    k = int(ids.max()) + 1
    length = ids.shape[0]
    rng = np.random.default_rng(1)
    table = rng.standard_normal((2, 2, length, k), dtype=np.float32)
    attn = rng.random((2, 2, length, length), dtype=np.float32)
    grid = np.zeros((height, width), np.int64)
    fly = dict(ATTRS, method=method, ratio=ratio, skip=skip)
    got = run(op_model("RPEGatherGrid", **fly), "on", x=table, index=grid)
    assert np.array_equal(got, rpe_gather(torch.from_numpy(table), torch.from_numpy(ids)).numpy())
    got = run(op_model("RPEScatterGrid", num_buckets=k, **fly), "on", x=attn, index=grid)
    ref = rpe_scatter(torch.from_numpy(attn), torch.from_numpy(ids), k).numpy()
    assert np.abs(got - ref).max() <= 1e-6


BAD_ATTRIBUTES = [  # (op, attributes, error); the function path can serve these nodes
    ("RPEScatter", dict(ATTRS, plugin_version="2", num_buckets=50), "plugin_version' is '2'"),
    ("RPEGather", dict(ATTRS, plugin_namespace="other"), "plugin_namespace' is 'other'"),
    ("RPEGather", dict(ATTRS, num_buckets="fifty"), "'num_buckets' must be an int"),
]


@pytest.mark.parametrize("op,attrs,message", BAD_ATTRIBUTES)
def test_bad_attribute_is_a_clear_error_or_a_logged_fallback(ort_library, op, attrs, message,
                                                             caplog):
    model = op_model(op, **attrs)
    with pytest.raises(CustomOpsError, match=message):
        env_session(model, custom_ops="on")
    with caplog.at_level(logging.WARNING, logger="irpe.runtime.onnxruntime.session"):
        session, path = env_session(model, custom_ops="auto")
    assert not path.custom_ops and message in path.reason
    assert "retrying with the ONNX functions" in caplog.text
    ids, table, attn = layer()
    x = table if op == "RPEGather" else attn
    assert session.run(None, {"x": x, "index": ids})[0].shape[:3] == (2, 3, 26)


@pytest.mark.parametrize("op,attrs,message", [
    ("RPEGatherGrid", dict(ATTRS, method="spiral", ratio=1.9), "unknown method 'spiral'"),
    ("RPEGatherGrid", dict(ATTRS, method="product", ratio=0.0), "need ratio > 0"),
    ("RPEScatterGrid", dict(ATTRS, ratio=1.9), "needs a method"),
    ("RPEScatterGrid", dict(ATTRS, method="product", ratio=1.9, num_buckets=7),
     "num_buckets 7 does not match method product"),
])
def test_bad_grid_attributes_name_the_node_and_field(ort_library, op, attrs, message):
    """No function can serve a *Grid node: auto mode reports ONNX Runtime's own error."""
    model = op_model(op, **attrs)
    with pytest.raises(CustomOpsError, match=f"{op} node '': .*{message}"):
        env_session(model, custom_ops="on")
    with pytest.raises(Exception, match="RPE"):
        env_session(model, custom_ops="auto")


def test_plain_ops_ignore_grid_fields(ort_library):
    """RPEGather reads num_buckets only (the TensorRT creator's one field), like the parser."""
    ids, table, _ = layer()
    model = op_model("RPEGather", num_buckets=50, method="spiral", **ATTRS)
    assert np.array_equal(run(model, "on", x=table, index=ids), run(model, "off", x=table,
                                                                     index=ids))


@pytest.mark.parametrize("num_buckets", [None, -4])
def test_scatter_without_a_valid_num_buckets_is_refused(ort_library, num_buckets):
    """Neither path can serve it: the custom op names the attribute, the fallback fails too."""
    extra = {} if num_buckets is None else {"num_buckets": num_buckets}
    model = op_model("RPEScatter", **ATTRS, **extra)
    with pytest.raises(CustomOpsError, match=r"num_buckets must be in \[1, 2\^31\)"):
        env_session(model, custom_ops="on")


@pytest.mark.parametrize("op,x_shape,index,message", [
    ("RPEGather", (2, 3, 26, 49), None, "table has 49 buckets, num_buckets is 50"),
    ("RPEGather", (2, 3, 7, 50), None, "table has 7 query rows, the index 26"),
    ("RPEScatter", (2, 3, 26, 25), None, "attn is 26x25 per head, the index 26x26"),
    ("RPEGather", (2, 3, 26), None, "input 0 must be 4-D, got 3-D"),
    ("RPEGather", (2, 3, 26, 50), np.zeros((26, 26), np.float32), "index must be int32 or int64"),
])
def test_bad_input_shapes_fail_the_run_not_the_process(ort_library, op, x_shape, index, message):
    ids = bucket_ids("product", 1.9, 5, 5, skip=1).numpy() if index is None else index
    dtype = helper.np_dtype_to_tensor_dtype(ids.dtype)
    session, path = env_session(op_model(op, index=dtype, num_buckets=50, **ATTRS),
                                   custom_ops="on")
    with pytest.raises(Exception, match=message):
        session.run(None, {"x": np.zeros(x_shape, np.float32), "index": ids})
    good = np.zeros((2, 3, 26, 50 if op == "RPEGather" else 26), np.float32)
    if index is None:  # the session still serves good input afterwards
        assert session.run(None, {"x": good, "index": ids})[0].shape[:3] == (2, 3, 26)


def test_missing_library(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("IRPE_ORT_OPS_LIBRARY", str(tmp_path / "nope.so"))
    model = op_model("RPEScatter", num_buckets=50, **ATTRS)
    with pytest.raises(CustomOpsError, match="no custom-op library at .*nope.so"):
        env_session(model, custom_ops="on")
    with caplog.at_level(logging.INFO, logger="irpe.runtime.onnxruntime.session"):
        _, path = env_session(model)  # auto: the functions, said in one log line
    assert not path.custom_ops
    assert [r.getMessage() for r in caplog.records] == [
        f"onnxruntime iRPE ops: ONNX functions (no custom-op library at {tmp_path / 'nope.so'})"]


def _refused_library(library: Path, monkeypatch, caplog, error: str, warning: str):
    """``library`` cannot serve: mode on raises ``error``, mode auto warns ``warning`` and
    falls back to the functions; returns that fallback session."""
    monkeypatch.setenv("IRPE_ORT_OPS_LIBRARY", str(library))
    model = op_model("RPEScatter", num_buckets=50, **ATTRS)
    with pytest.raises(CustomOpsError, match=error):
        env_session(model, custom_ops="on")
    with caplog.at_level(logging.WARNING, logger="irpe.runtime.onnxruntime.session"):
        session, path = env_session(model, custom_ops="auto")
    assert not path.custom_ops and warning in caplog.text
    return session


def test_not_a_library(tmp_path, monkeypatch, caplog):
    fake = tmp_path / "libfake.so"
    fake.write_text("not an ELF file\n")
    _refused_library(fake, monkeypatch, caplog, "cannot load .*libfake.so",
                     "using the ONNX functions")


def test_library_for_another_api_version(tmp_path_factory, monkeypatch, caplog):
    """A library asking for an API this onnxruntime lacks: refused with a clear message."""
    lib = _build(tmp_path_factory.mktemp("ort_api99"), "-DIRPE_ORT_API_VERSION=99")
    session = _refused_library(lib, monkeypatch, caplog,
                               "built for ONNX Runtime API 99 .*rebuild", "API 99")
    ids, _, attn = layer()
    assert session.run(None, {"x": attn, "index": ids})[0].shape == (2, 3, 26, 50)


def test_mode_switch_and_environment(ort_library, monkeypatch):
    model = op_model("RPEScatter", num_buckets=50, **ATTRS)
    monkeypatch.setenv("IRPE_ORT_CUSTOM_OPS", "off")
    assert not env_session(model)[1].custom_ops
    monkeypatch.setenv("IRPE_ORT_CUSTOM_OPS", "1")
    assert env_session(model)[1].custom_ops
    monkeypatch.setenv("IRPE_ORT_CUSTOM_OPS", "sometimes")
    with pytest.raises(ValueError, match="IRPE_ORT_CUSTOM_OPS='sometimes': custom-ops mode "
                       "must be auto, on or off"):
        env_session(model)


def test_cuda_ep_glue_compiles(ort_library):
    """The CUDA EP half (rpe_ort_cuda.cpp + the CUDA op registrations) compiles warning-free
    here; plugins/build.sh links it with the nvcc-built kernels (run: tests/gpu)."""
    compiler = shutil.which("g++") or pytest.skip("g++ not found")
    root = headers()
    include = next(root / s for s in ("include", "include/onnxruntime")
                   if (root / s / "onnxruntime_cxx_api.h").is_file())
    done = subprocess.run(
        [compiler, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
         "-DIRPE_ORT_WITH_CUDA", f"-I{include}", f"-I{ROOT / 'plugins' / 'kernels'}",
         f"-I{ROOT / 'plugins' / 'cpu'}", f"-I{SOURCE}", str(SOURCE / "rpe_ort_cuda.cpp"),
         str(SOURCE / "rpe_ort_ops.cpp")],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("base_shape", [(2, 3, 26, 26), (1, 3, 26, 26), (26, 26), (1, 1, 1, 26)])
def test_gather_add_fused_at_load_equals_unfused(ort_library, base_shape):
    ids, table, _ = layer()
    base = np.random.default_rng(3).standard_normal(base_shape, dtype=np.float32)
    feeds = {"table": table, "index": ids, "base": base}
    session, path = env_session(add_model(base_shape), threads=2, custom_ops="on")
    assert path.fused == 1 and "(1 gather+Add fused)" in path.describe()
    functions, _ = env_session(add_model(base_shape), custom_ops="off")
    assert np.array_equal(session.run(None, feeds)[0], functions.run(None, feeds)[0])


def test_gather_add_not_fused_when_the_gather_has_other_uses(ort_library, monkeypatch):
    ids, table, _ = layer()
    feeds = {"table": table, "index": ids, "base": np.ones((2, 3, 26, 26), np.float32)}
    session, path = env_session(add_model(None, second_use=True), custom_ops="on")
    assert path.custom_ops and path.fused == 0
    out, g = session.run(None, feeds)
    assert np.array_equal(out, g + 1)
    monkeypatch.setenv("IRPE_ORT_FUSE", "0")
    assert env_session(add_model(None), custom_ops="on")[1].fused == 0


def test_gather_add_bad_broadcast_is_a_run_error(ort_library):
    ids, table, _ = layer()
    session, _ = env_session(add_model(None), custom_ops="on")
    with pytest.raises(Exception, match="RPEGatherAdd: input 2 dim 1 is 4, the gather's 3"):
        session.run(None, {"table": table, "index": ids,
                           "base": np.ones((2, 4, 26, 26), np.float32)})


def _run_bfloat16(op: str, x: torch.Tensor, ids: np.ndarray, width: int) -> torch.Tensor:
    """Run one op on bfloat16 tensors (numpy has none: 16-bit words through io_binding)."""
    session, path = env_session(op_model(op, TensorProto.BFLOAT16, num_buckets=50, **ATTRS),
                                   custom_ops="on")
    out = np.zeros(tuple(x.shape[:3]) + (width,), np.uint16)
    binding = session.io_binding()
    bits = x.view(torch.int16).numpy().view(np.uint16)
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        bits, TensorProto.BFLOAT16))
    binding.bind_cpu_input("index", ids)
    binding.bind_ortvalue_output("out", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        out, TensorProto.BFLOAT16))
    session.run_with_iobinding(binding)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)


def test_bfloat16_both_ops(ort_library):
    ids = bucket_ids("product", 1.9, 5, 5, skip=1).numpy()
    table = torch.randn(2, 3, 26, 50).to(torch.bfloat16)
    assert torch.equal(_run_bfloat16("RPEGather", table, ids, 26),
                       rpe_gather(table, torch.from_numpy(ids)))
    attn = torch.rand(2, 3, 26, 26).to(torch.bfloat16)
    assert torch.equal(_run_bfloat16("RPEScatter", attn, ids, 50),
                       rpe_scatter(attn, torch.from_numpy(ids), 50))  # fp32 sums, one rounding


def test_two_gather_adds_in_a_row_become_one_node(ort_library):
    """Add(Add(x, gather K), gather Q) -> RPEGatherAdd2: the graph's order of additions."""
    from irpe.runtime.graph.rewrites import fuse_gather_add
    ids, table, _ = layer()
    nodes = [helper.make_node("RPEGather", [f"t{n}", "index"], [f"g{n}"], domain="irpe",
                              num_buckets=50, **ATTRS) for n in (1, 2)]
    nodes += [helper.make_node("Add", ["base", "g1"], ["s"]),
              helper.make_node("Add", ["s", "g2"], ["out"])]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("g1", "g2")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in
              ("t1", "t2", "base")] + [helper.make_tensor_value_info("index", TensorProto.INT64,
                                                                     None)]
    graph = helper.make_graph(nodes, "add2", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              value_info=value)
    data = gather_graph_model(graph)
    fused, count = fuse_gather_add(data)
    assert count == 2 and b"RPEGatherAdd2" in fused
    rng = np.random.default_rng(4)
    feeds = {"t1": table, "t2": rng.standard_normal(table.shape, dtype=np.float32),
             "base": rng.standard_normal((2, 3, 26, 26), dtype=np.float32), "index": ids}
    got = env_session(data, threads=2, custom_ops="on")[0].run(None, feeds)[0]
    assert np.array_equal(got, env_session(data, custom_ops="off")[0].run(None, feeds)[0])
