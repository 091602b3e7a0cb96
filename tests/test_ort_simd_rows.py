"""The SIMD gather rows of the load-time fused ops (rpe_terms.h, rpe_rows_avx512.cpp): table
sizes on both sides of the AVX-512 register lookup's limits (16 / 32 / 64 buckets: one or two
two-table permutes, else a memory gather), ids outside the table, int32 / int64 ids, one and two
terms (per-query table and the 1-row iRPE-Q form), key counts that leave partial vectors:
bit-identical to the same float32 additions in numpy on every SIMD level the CPU has."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from irpe.artifact.contract import DEFAULT_OPSET
from irpe.runtime.graph.rewrites import fuse_gather_add
from tests.helpers import ORT_ATTRS as ATTRS
from tests.helpers import env_session

pytestmark = pytest.mark.usefixtures("ort_library_env")  # fixtures: tests/conftest.py

SIMD = ["portable", "avx2", "avx512"]  # capped to what the CPU has


def _model(terms: int, k: int, n: int, index_type) -> bytes:
    from export.functions import gather_function
    itype = TensorProto.INT32 if index_type == np.int32 else TensorProto.INT64
    nodes = [helper.make_node("RPEGather", ["t1", "ids"], ["g1"], domain="irpe", num_buckets=k,
                              **ATTRS),
             helper.make_node("Add", ["base", "g1"], ["s1" if terms == 2 else "out"])]
    if terms == 2:
        nodes += [helper.make_node("RPEGather", ["t2", "idt"], ["g2"], domain="irpe",
                                   num_buckets=n * k, **ATTRS),
                  helper.make_node("Add", ["s1", "g2"], ["out"])]
    floats = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)
              for x in ("t1", "base", "t2")[:3 if terms == 2 else 2]]
    ints = [helper.make_tensor_value_info(x, itype, None) for x in ("ids", "idt")[:terms]]
    graph = helper.make_graph(nodes, "rows", floats + ints,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              value_info=[helper.make_tensor_value_info(g, TensorProto.FLOAT, None)
                                          for g in ("g1", "g2")[:terms]])
    model = helper.make_model(graph, functions=[gather_function(DEFAULT_OPSET)], opset_imports=[
        helper.make_opsetid("", DEFAULT_OPSET), helper.make_opsetid("irpe", 1)])
    model.ir_version = 9
    fused, count = fuse_gather_add(model.SerializeToString())
    assert count == terms
    return fused


def _feeds(terms: int, k: int, n: int, index_type, b=2, h=3, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, k, (n, n))
    ids.flat[rng.choice(n * n, 2 * n, replace=False)] = -1  # no bucket: adds 0
    ids.flat[rng.choice(n * n, n, replace=False)] = k       # past the table: adds 0
    feeds = {"t1": rng.standard_normal((b, h, n, k), dtype=np.float32),
             "base": rng.standard_normal((b, h, n, n), dtype=np.float32),
             "ids": ids.astype(index_type)}
    if terms == 2:
        q = rng.integers(0, k, (n, n))
        feeds["t2"] = rng.standard_normal((b, h, 1, n * k), dtype=np.float32)
        feeds["idt"] = (q + np.arange(n)[None, :] * k).astype(index_type)  # key j's row
    return feeds


def _numpy(feeds, terms: int, k: int, n: int) -> np.ndarray:
    ids = feeds["ids"].astype(np.int64)
    valid = (ids >= 0) & (ids < k)
    g1 = np.take_along_axis(feeds["t1"], np.broadcast_to(np.where(valid, ids, 0),
                                                         feeds["base"].shape), -1)
    out = feeds["base"] + np.where(valid, g1, np.float32(0))
    if terms == 2:
        out = out + feeds["t2"][:, :, 0][:, :, feeds["idt"].astype(np.int64)]
    return out


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("k", [5, 16, 17, 32, 33, 50, 64, 65, 134])
@pytest.mark.parametrize("terms", [1, 2])
def test_rows_equal_numpy_bit_for_bit(ort_library, monkeypatch, simd, k, terms):
    """n = 23 keys: one full 16-key vector and a partial one (two 8-key AVX2 vectors + 7)."""
    monkeypatch.setenv("IRPE_ORT_SIMD", simd)
    n = 23
    for index_type in (np.int64, np.int32):
        feeds = _feeds(terms, k, n, index_type)
        session, path = env_session(_model(terms, k, n, index_type), threads=2,
                                       custom_ops="on", quiet=True)
        (got,) = session.run(None, feeds)
        assert np.array_equal(got, _numpy(feeds, terms, k, n)), (simd, k, terms, index_type)
