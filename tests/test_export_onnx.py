"""ONNX export: ORT parity for every iRPE variant, RPE nodes + local functions, --inline,
metadata, opsets, DeiT-S at full size, and clear errors for bad input."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.functions import DOMAIN, GATHER, SCATTER
from export.onnx import export_onnx
from irpe import RPEConfig, create_model, randomize_tables
from irpe.artifact.contract import read_onnx_props, read_onnx_spec
from irpe.artifact.trained import default_spec, save_trained
from tests.helpers import tiny_deit


def run_ort(path, **feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


def assert_parity(model, path, batch=3, size=40, atol=1e-4):
    x = torch.randn(batch, 3, size, size)
    with torch.no_grad():
        ref = model(x).numpy()
    (got,) = run_ort(path, images=x)
    np.testing.assert_allclose(got, ref, atol=atol, rtol=1e-4)
    return got


def op_counts(model_proto):
    counts = {}
    for node in model_proto.graph.node:
        if node.domain == DOMAIN:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


MATRIX = [(method, mode, shared) for method in ("euc", "quant", "product", "cross")
          for mode in ("bias", "ctx") for shared in (True, False)]


@pytest.mark.parametrize("method,mode,shared", MATRIX)
def test_every_variant_matches_pytorch(tmp_path, method, mode, shared):
    on = "qkv" if mode == "ctx" else "qk"  # bias is not defined on values
    cfg = RPEConfig(ratio=1.9, method=method, mode=mode, shared_head=shared, skip=1, on=on)
    model, spec = tiny_deit(cfg)
    path = export_onnx(model, tmp_path / "m.onnx", spec=spec)
    assert_parity(model, path)
    proto = onnx.load(path)
    halves = 2 if method == "cross" else 1  # cross = rows + cols modules
    expected = {GATHER: 2 * halves * 2, SCATTER: 1 * halves * 2} if mode == "ctx" else {}
    assert op_counts(proto) == expected
    assert sorted(f.name for f in proto.functions) == sorted(expected)
    assert all(f.domain == DOMAIN for f in proto.functions)


@pytest.fixture(scope="module")
def qkv_files(tmp_path_factory):
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    model, spec = tiny_deit(cfg)
    d = tmp_path_factory.mktemp("qkv")
    return (model, spec, export_onnx(model, d / "fn.onnx", spec=spec),
            export_onnx(model, d / "inl.onnx", spec=spec, inline=True))


def test_rpe_nodes_carry_plugin_attributes(qkv_files):
    model, spec, path, _ = qkv_files
    proto = onnx.load(path)
    nodes = [n for n in proto.graph.node if n.domain == DOMAIN]
    assert {n.op_type for n in nodes} == {GATHER, SCATTER}
    buckets = []
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs.keys() == {"plugin_namespace", "plugin_version", "num_buckets"}
        assert attrs["plugin_namespace"] == b"irpe" and attrs["plugin_version"] == b"1"
        buckets.append((node.op_type, attrs["num_buckets"]))
    # per block: K gather and V scatter on the 50 buckets; the Q term gathers from ONE row of
    # all 26 tokens' tables (26 * 50 values) with a transposed index
    assert sorted(buckets) == sorted([(GATHER, 50), (GATHER, 26 * 50), (SCATTER, 50)] * 2)
    assert any(o.domain == DOMAIN and o.version == 1 for o in proto.opset_import)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.ir_version <= 10 and proto.opset_import[0].version >= 17


def test_no_attention_sized_transpose_after_a_gather(qkv_files):
    """The Q term comes out of its gather already transposed (no Transpose of (B,H,L,L))."""
    _, _, path, _ = qkv_files
    proto = onnx.load(path)
    gathered = {n.output[0] for n in proto.graph.node if n.op_type == GATHER}
    consumers = [n.op_type for n in proto.graph.node if set(n.input) & gathered]
    assert consumers and "Transpose" not in consumers, consumers


def test_detection_export_keeps_the_transpose_form(tmp_path):
    """Dynamic sizes (DETR) cannot use the 1-row table (L*K is not static): every gather
    table keeps its query rows; parity at several sizes is in test_export_detr.py."""
    cfg = RPEConfig(ratio=2.0, method="product", mode="ctx", shared_head=True, skip=0, on="qk")
    model = create_model("detr_tiny_irpe", rpe_config=cfg).eval()
    path = export_onnx(model, tmp_path / "d.onnx", spec=default_spec("detr_tiny_irpe"))
    proto = onnx.load(path)
    buckets = {onnx.helper.get_attribute_value(a) for n in proto.graph.node if n.op_type == GATHER
               for a in n.attribute if a.name == "num_buckets"}
    assert buckets == {81}


def test_inline_output_has_no_rpe_nodes_and_same_results(qkv_files):
    model, _, path, inlined = qkv_files
    proto = onnx.load(inlined)
    assert not proto.functions and op_counts(proto) == {}
    assert all(o.domain != DOMAIN for o in proto.opset_import)
    assert {"MatMul", "Gather", "Equal"} <= {n.op_type for n in proto.graph.node}
    onnx.checker.check_model(proto, full_check=True)
    x = torch.randn(2, 3, 40, 40)
    np.testing.assert_array_equal(run_ort(inlined, images=x)[0], run_ort(path, images=x)[0])
    assert json.loads(read_onnx_props(inlined)["irpe.inline"]) is True


def test_dynamic_batch_and_metadata(qkv_files):
    model, spec, path, _ = qkv_files
    for batch in (1, 5):
        assert_parity(model, path, batch=batch)
    assert read_onnx_spec(path).metadata() == spec.metadata()
    props = read_onnx_props(path)
    assert set(spec.metadata()) <= set(props)
    assert json.loads(props["irpe.rpe_config"])["config"] == "rpe-1.9-product-ctx-1-qkv"
    assert json.loads(props["irpe.rpe_nodes"]) == {GATHER: 4, SCATTER: 2}
    assert props["irpe.weights"] == "module" and props["irpe.opset"] == "18"
    inputs = onnx.load(path).graph.input
    dims = [d.dim_param or d.dim_value for d in inputs[0].type.tensor_type.shape.dim]
    assert [i.name for i in inputs] == ["images"] and dims == ["batch", 3, 40, 40]


@pytest.mark.parametrize("opset", [17, 20])
def test_other_opsets(tmp_path, opset):
    cfg = RPEConfig(ratio=1.9, method="euc", mode="ctx", shared_head=False, skip=1, on="kv")
    model, spec = tiny_deit(cfg)
    path = export_onnx(model, tmp_path / "m.onnx", spec=spec, opset=opset)
    assert_parity(model, path)
    proto = onnx.load(path)
    assert proto.opset_import[0].version == opset
    assert all(f.opset_import[0].version == opset for f in proto.functions)


def test_distilled_model_exports_the_eval_average(tmp_path):
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=2, on="k")
    model, spec = tiny_deit(cfg, distilled=True)
    assert_parity(model, export_onnx(model, tmp_path / "d.onnx", spec=spec))


def test_trained_file_source_records_its_weights(tmp_path):
    cfg = RPEConfig(ratio=1.9, method="quant", mode="ctx", shared_head=True, skip=1, on="k")
    model, spec = tiny_deit(cfg)
    save_trained(model, str(tmp_path / "t.safetensors"), spec)
    path = export_onnx(str(tmp_path / "t.safetensors"), tmp_path / "t.onnx")
    assert read_onnx_props(path)["irpe.weights"] == f"trained:{tmp_path / 't.safetensors'}"
    assert read_onnx_spec(path).metadata() == spec.metadata()
    assert_parity(model, path)


def test_deit_small_full_size_irpe_k(tmp_path):
    name = "deit_small_patch16_224_ctx_product_50_shared_k"
    model = create_model(name).eval()
    randomize_tables(model, std=0.02)
    path = export_onnx(model, tmp_path / "s.onnx", spec=default_spec(name))
    assert op_counts(onnx.load(path, load_external_data=False)) == {GATHER: 12}
    assert_parity(model, path, batch=2, size=224)


def test_unknown_model_is_a_key_error(tmp_path):
    with pytest.raises(KeyError, match="unknown model 'deit_nope'"):
        export_onnx("deit_nope", tmp_path / "x.onnx")


@pytest.mark.parametrize("opset", [16, 21])
def test_unsupported_opset(tmp_path, opset):
    with pytest.raises(ValueError, match=f"opset {opset} is not supported; choose 17..20"):
        export_onnx("deit_tiny_patch16_224", tmp_path / "x.onnx", opset=opset)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        export_onnx("detr_tiny_irpe", tmp_path / "x.onnx", checkpoint=str(tmp_path / "no.pth"))
    assert not (tmp_path / "x.onnx").exists()


def test_module_without_spec_and_file_with_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="needs spec="):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="do not pass a checkpoint"):
        export_onnx(str(tmp_path / "t.safetensors"), tmp_path / "x.onnx", checkpoint="c.pth")


def test_corrupt_or_foreign_onnx_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a protobuf\xff" * 10)
    with pytest.raises(ValueError, match="not a readable ONNX file"):
        read_onnx_spec(bad)
    with pytest.raises(FileNotFoundError):
        read_onnx_spec(tmp_path / "missing.onnx")
    plain = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    onnx.save(plain, tmp_path / "plain.onnx")
    with pytest.raises(ValueError, match="not an irpe trained-model file"):
        read_onnx_spec(tmp_path / "plain.onnx")
