"""ORT custom ops on the CUDA execution provider (libirpe_ort_ops_cuda.so: the plugins/kernels
kernels on ONNX Runtime's compute stream) against PyTorch's irpe ops.

Needs onnxruntime-gpu (CUDAExecutionProvider) and the CUDA build of the library (plugins/build.sh
-> build/plugins/libirpe_ort_ops_cuda.so, or IRPE_ORT_OPS_LIBRARY); skipped otherwise."""
import json
import os
import tempfile

import numpy as np
import pytest
import torch

from irpe import bucket_ids, rpe_gather, rpe_scatter
from irpe.runtime.onnxruntime.session import find_library
from tests.helpers import ORT_ATTRS as ATTRS
from tests.helpers import ort_op_model as op_model

ort = pytest.importorskip("onnxruntime")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="onnxruntime without CUDAExecutionProvider (install onnxruntime-gpu)")]
PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture(scope="module")
def library():
    path = find_library(cuda=True)
    if path is None:
        pytest.skip("libirpe_ort_ops_cuda.so not built (plugins/build.sh)")
    return str(path)


def session(model: bytes, library: str, profile: bool = False):
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.enable_profiling = profile
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort_profile")  # not the cwd
    return ort.InferenceSession(model, options, providers=PROVIDERS)


def cuda_nodes(sess) -> set:
    """op_name of the nodes the profile shows on the CUDA EP."""
    with open(sess.end_profiling()) as f:
        return {e["args"]["op_name"] for e in json.load(f) if e.get("cat") == "Node"
                and e["args"].get("provider") == "CUDAExecutionProvider"}


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_and_scatter_on_the_cuda_ep(library, index_dtype):
    ids = bucket_ids("product", 1.9, 14, 14, skip=1).numpy().astype(index_dtype)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((4, 6, 197, 50), dtype=np.float32)
    attn = rng.random((4, 6, 197, 197), dtype=np.float32)
    itype = {np.int32: 6, np.int64: 7}[index_dtype]
    gather = session(op_model("RPEGather", index=itype, num_buckets=50, **ATTRS), library, True)
    got = gather.run(None, {"x": table, "index": ids})[0]
    assert np.array_equal(got, rpe_gather(torch.from_numpy(table), torch.from_numpy(ids)).numpy())
    assert "RPEGather" in cuda_nodes(gather)
    scatter = session(op_model("RPEScatter", index=itype, num_buckets=50, **ATTRS), library, True)
    got = scatter.run(None, {"x": attn, "index": ids})[0]
    ref = rpe_scatter(torch.from_numpy(attn), torch.from_numpy(ids), 50).numpy()
    assert np.abs(got - ref).max() <= 1e-5
    assert "RPEScatter" in cuda_nodes(scatter)


def test_one_row_q_table_on_the_cuda_ep(library):
    ids = bucket_ids("product", 1.9, 14, 14, skip=1).numpy()
    table = np.random.default_rng(1).standard_normal((2, 6, 197, 50), dtype=np.float32)
    flat = (ids + np.arange(197)[:, None] * 50).T.copy()
    model = op_model("RPEGather", num_buckets=197 * 50, **ATTRS)
    got = session(model, library).run(None, {"x": table.reshape(2, 6, 1, -1), "index": flat})[0]
    ref = rpe_gather(torch.from_numpy(table), torch.from_numpy(ids)).transpose(2, 3).numpy()
    assert np.array_equal(got, ref)


def test_fp16_scatter_on_the_cuda_ep(library):
    ids = bucket_ids("euc", 2.0, 5, 7, skip=0).numpy()
    k = int(ids.max()) + 1
    attn = np.random.default_rng(2).random((2, 3, 35, 35)).astype(np.float16)
    model = op_model("RPEScatter", dtype=10, num_buckets=k, **ATTRS)
    got = session(model, library).run(None, {"x": attn, "index": ids})[0]
    ref = rpe_scatter(torch.from_numpy(attn), torch.from_numpy(ids), k).numpy()
    assert got.dtype == np.float16 and np.abs(got.astype(np.float32) - ref).max() <= 2e-3


@pytest.mark.parametrize("op", ["RPEGather", "RPEScatter"])
def test_cuda_ep_equals_the_cpu_ep(library, op):
    """The same node through the library's CUDA EP kernel and its CPU EP kernel (`make
    gpu-check`'s ORT probe): gather exact, scatter within fp32 summation-order rounding."""
    ids = bucket_ids("quant", 33, 9, 11, skip=1).numpy()
    k = int(ids.max()) + 1
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 100, k), dtype=np.float32) if op == "RPEGather" else \
        rng.random((2, 3, 100, 100), dtype=np.float32)
    model = op_model(op, num_buckets=k, **ATTRS)
    on_cuda = session(model, library, profile=True)
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    on_cpu = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    got = on_cuda.run(None, {"x": x, "index": ids})[0]
    ref = on_cpu.run(None, {"x": x, "index": ids})[0]
    assert op in cuda_nodes(on_cuda)
    if op == "RPEGather":
        assert np.array_equal(got, ref)
    else:
        assert np.abs(got - ref).max() <= 1e-5
