"""`irpe triton-repo`: every config.pbtxt parsed with Triton's own ModelConfig schema and checked
against the ONNX file's inputs/outputs; the copied model runs in ONNX Runtime at the config's
shapes; label file, plugin/custom-op plumbing, and one-line errors for bad input."""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2  # Triton's schema (tritonclient[grpc], dev extra)

from export.onnx import export_onnx
from irpe.artifact.contract import read_onnx_props
from irpe.cli import main

DEMO = Path(__file__).resolve().parents[1] / "irpe" / "demo"
# ONNX element type -> Triton data type, written out independently of export/triton_repo.py
DTYPES = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.INT64: "TYPE_INT64"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """Classifier exported by the command itself (from its .safetensors); detector from .onnx."""
    base = tmp_path_factory.mktemp("triton")
    detr = export_onnx(str(DEMO / "detr_shapes_irpe.safetensors"), base / "detr.onnx")
    out = base / "repo"
    assert main(["triton-repo", str(DEMO / "deit_shapes_irpe.safetensors"), str(detr),
                 "-o", str(out), "--instances", "2", "--ort-ops", "none"]) == 0
    return out, Path(detr)


def parse(path: Path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def onnx_io(path: Path):
    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    return ([v for v in model.graph.input if v.name not in inits], list(model.graph.output))


def _dims(value):
    return [d.dim_value if d.HasField("dim_value") else -1
            for d in value.type.tensor_type.shape.dim]


def check_against_onnx(cfg, onnx_path: Path) -> None:
    inputs, outputs = onnx_io(onnx_path)
    for section, values in ((cfg.input, inputs), (cfg.output, outputs)):
        assert [t.name for t in section] == [v.name for v in values]
        for t, v in zip(section, values, strict=True):
            assert model_config_pb2.DataType.Name(t.data_type) == \
                DTYPES[v.type.tensor_type.elem_type]
            assert _dims(v)[0] == -1 and list(t.dims) == _dims(v)[1:]  # batch axis stripped


def test_tree_and_configs_match_onnx(repo):
    out, detr = repo
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["README.md", "deit_shapes_irpe/1/model.onnx", "deit_shapes_irpe/config.pbtxt",
                     "deit_shapes_irpe/labels.txt", "detr_shapes_irpe/1/model.onnx",
                     "detr_shapes_irpe/config.pbtxt"]
    assert (out / "detr_shapes_irpe/1/model.onnx").read_bytes() == detr.read_bytes()
    for name in ("deit_shapes_irpe", "detr_shapes_irpe"):
        cfg = parse(out / name / "config.pbtxt")
        assert cfg.name == name and cfg.platform == "onnxruntime_onnx"
        assert cfg.max_batch_size == 8 and cfg.dynamic_batching.max_queue_delay_microseconds == 5000
        assert [(g.count, g.kind) for g in cfg.instance_group] == \
            [(2, model_config_pb2.ModelInstanceGroup.KIND_GPU)]
        assert not cfg.HasField("model_operations")
        check_against_onnx(cfg, out / name / "1" / "model.onnx")
    detr_cfg = parse(out / "detr_shapes_irpe" / "config.pbtxt")
    assert list(detr_cfg.input[0].dims) == [3, -1, -1]  # dynamic H, W
    assert "tritonserver --model-repository=/models" in (out / "README.md").read_text()


def test_label_file_for_classification(repo):
    out, _ = repo
    cfg = parse(out / "deit_shapes_irpe" / "config.pbtxt")
    assert cfg.output[0].label_filename == "labels.txt"
    labels = (out / "deit_shapes_irpe" / "labels.txt").read_text().splitlines()
    props = read_onnx_props(out / "deit_shapes_irpe" / "1" / "model.onnx")
    assert labels == json.loads(props["irpe.class_names"]) and len(labels) == cfg.output[0].dims[0]
    detr_cfg = parse(out / "detr_shapes_irpe" / "config.pbtxt")
    assert all(not o.label_filename for o in detr_cfg.output)  # no-object class: not a classifier


@pytest.mark.parametrize("name,hw", [("deit_shapes_irpe", None), ("detr_shapes_irpe", (64, 96))])
def test_model_runs_at_config_shapes(repo, name, hw):
    """Feed ONNX Runtime what Triton would (max_batch_size x config dims): outputs fit config."""
    out, _ = repo
    cfg = parse(out / name / "config.pbtxt")
    session = ort.InferenceSession(str(out / name / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    batch, feeds = cfg.max_batch_size, {}
    for t in cfg.input:
        dims = [hw[i - 1] if d == -1 else d for i, d in enumerate(t.dims)]
        if t.data_type == model_config_pb2.TYPE_INT64:  # detection: per-image (h, w)
            feeds[t.name] = np.tile(np.array(hw, dtype=np.int64), (batch, 1))
        else:
            feeds[t.name] = np.random.default_rng(0).random([batch, *dims], dtype=np.float32)
    results = session.run([o.name for o in cfg.output], feeds)
    assert [list(r.shape) for r in results] == [[batch, *o.dims] for o in cfg.output]


def _fake_engine(tmp_path: Path, onnx_path: Path, module: str, plugin_layers, libs) -> Path:
    """A file with an engine tag + the sidecar `irpe build-engine` writes: the writer only copies
    the plan (no TensorRT here can build one that Triton's TensorRT backend would load)."""
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"ftrt" + bytes(60))
    side = {"engine": engine.name, "onnx": str(onnx_path), "tensorrt_module": module,
            "tensorrt_version": "10.13.0", "profiles": {"images": [[1, 3, 64, 64], [4, 3, 64, 64],
                                                                   [16, 3, 64, 64]]},
            "plugin_libraries": libs, "plugin_layers": plugin_layers,
            "onnx_metadata": read_onnx_props(onnx_path)}
    Path(f"{engine}.json").write_text(json.dumps(side))
    return engine


def test_tensorrt_plan_with_plugin(repo, tmp_path, capsys):
    out, _ = repo
    onnx_path = out / "deit_shapes_irpe" / "1" / "model.onnx"
    plugin = tmp_path / "libirpe_trt_plugins.so"
    plugin.write_bytes(b"\x7fELF placeholder")
    engine = _fake_engine(tmp_path, onnx_path, "tensorrt", ["rpe_k_0"], [str(plugin)])
    repo2 = tmp_path / "trt"
    assert main(["triton-repo", str(engine), "-o", str(repo2), "--name", "deit_trt"]) == 0
    assert "deit_trt" in capsys.readouterr().out
    cfg = parse(repo2 / "deit_trt" / "config.pbtxt")
    assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == 16  # profile maximum
    check_against_onnx(cfg, onnx_path)
    assert (repo2 / "deit_trt" / "1" / "model.plan").read_bytes() == engine.read_bytes()
    assert (repo2 / "deit_trt" / plugin.name).read_bytes() == plugin.read_bytes()
    flag = '--backend-config=tensorrt,plugins="/models/deit_trt/libirpe_trt_plugins.so"'
    assert flag in (repo2 / "README.md").read_text()
    assert flag in (repo2 / "deit_trt" / "config.pbtxt").read_text()


def test_real_engine_from_build_engine(repo, tmp_path, capsys):
    """An engine built here by `irpe build-engine`'s code: TensorRT-RTX (CI) is refused with the
    reason; full TensorRT (GPU machines with it) gives a tensorrt_plan with the profile's batch."""
    from irpe.runtime.tensorrt.build import build_engine
    from irpe.runtime.tensorrt.common import TensorRTUnavailable, import_tensorrt, is_rtx
    try:
        trt = import_tensorrt()
    except TensorRTUnavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no TensorRT module: {exc}")
    out, _ = repo
    onnx_path = out / "deit_shapes_irpe" / "1" / "model.onnx"
    engine = tmp_path / "deit.engine"
    build_engine(onnx_path, engine, batch=(1, 4, 8),
                 compute_capability="SM89" if is_rtx(trt) else None)
    argv = ["triton-repo", str(engine), "-o", str(tmp_path / "r")]
    if is_rtx(trt):
        err = _error(capsys, argv)
        assert f"built with {trt.__name__} {trt.__version__}: Triton's tensorrt_plan" in err
        return
    assert main(argv) == 0
    cfg = parse(tmp_path / "r" / "deit_shapes_irpe" / "config.pbtxt")
    assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == 8


def test_ort_custom_op_library_is_copied_and_referenced(repo, tmp_path):
    out, _ = repo
    lib = tmp_path / "libirpe_ort_ops.so"
    lib.write_bytes(b"\x7fELF placeholder")  # only copied and named: Triton loads it
    onnx_path = out / "detr_shapes_irpe" / "1" / "model.onnx"
    assert main(["triton-repo", str(onnx_path), "-o", str(tmp_path / "r"), "--name", "d",
                 "--ort-ops", str(lib), "--mount", "/mnt/models", "--kind", "cpu"]) == 0
    cfg = parse(tmp_path / "r" / "d" / "config.pbtxt")
    assert list(cfg.model_operations.op_library_filename) == ["/mnt/models/d/libirpe_ort_ops.so"]
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert (tmp_path / "r" / "d" / lib.name).is_file()


def test_ort_ops_auto_references_the_build_only_if_it_runs_the_file(repo, tmp_path):
    """auto: build/plugins/libirpe_ort_ops.so is referenced exactly when it exists and ONNX
    Runtime runs the model with it (checked here with a session of our own)."""
    from export.triton_repo import DEFAULT_ORT_OPS, RepoOptions, write_repository
    out, detr = repo
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (model,) = write_repository(tmp_path / "r", [str(detr)], RepoOptions(name="d"))
    libs = list(parse(model / "config.pbtxt").model_operations.op_library_filename)
    runs = DEFAULT_ORT_OPS.is_file() and _session_with(detr, DEFAULT_ORT_OPS)
    assert libs == (["/models/d/libirpe_ort_ops.so"] if runs else [])
    assert (model / "libirpe_ort_ops.so").is_file() == runs
    assert len(seen) == int(DEFAULT_ORT_OPS.is_file() and not runs)  # warned when skipped
    if runs:  # what the repository asks Triton to run computes what the plain file does
        options = ort.SessionOptions()
        options.register_custom_ops_library(str(model / "libirpe_ort_ops.so"))
        feeds = {"images": np.random.default_rng(1).random((2, 3, 64, 96), dtype=np.float32),
                 "sizes": np.array([[64, 96], [48, 80]], dtype=np.int64)}
        with_lib = ort.InferenceSession(str(model / "1" / "model.onnx"), options,
                                        providers=["CPUExecutionProvider"]).run(None, feeds)
        plain = ort.InferenceSession(str(detr), providers=["CPUExecutionProvider"]).run(None, feeds)
        for a, b in zip(with_lib, plain, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def _session_with(model: Path, lib: Path) -> bool:
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(lib))
    try:
        ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph types
        return False
    return True


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("irpe triton-repo: error: "), err
    return err


def test_bad_input(repo, tmp_path, capsys):
    out, detr = repo
    onnx_path = out / "deit_shapes_irpe" / "1" / "model.onnx"
    err = _error(capsys, ["triton-repo", str(detr), "-o", str(out)])
    assert "is not empty: pass --force" in err
    assert "unknown model 'deit_nope'" in _error(
        capsys, ["triton-repo", "deit_nope", "-o", str(tmp_path / "a")])
    assert not (tmp_path / "a").exists()  # a failed first write leaves no folder
    assert "--max-batch-size must be >= 1, got 0" in _error(
        capsys, ["triton-repo", str(detr), "--max-batch-size", "0", "-o", str(tmp_path / "a")])
    corrupt = tmp_path / "c.onnx"
    corrupt.write_bytes(b"garbage" * 20)
    assert "not a readable ONNX file" in _error(capsys, ["triton-repo", str(corrupt), "-o",
                                                         str(tmp_path / "b")])
    assert "two artifacts give the model name 'deit_shapes_irpe'" in _error(
        capsys, ["triton-repo", str(onnx_path), str(onnx_path), "-o", str(tmp_path / "c")])
    two = [str(onnx_path), str(detr)]
    assert "--name needs exactly one artifact" in _error(
        capsys, ["triton-repo", *two, "--name", "x", "-o", str(tmp_path / "d")])
    assert "custom-op library not found" in _error(
        capsys, ["triton-repo", str(onnx_path), "--ort-ops", "/no/lib", "-o", str(tmp_path / "e")])
    engine_dir = tmp_path / "eng"
    engine_dir.mkdir()
    engine = _fake_engine(engine_dir, onnx_path, "tensorrt", ["rpe_k_0"], ["/gone/lib.so"])
    assert "runs 1 iRPE plugin layers but its plugin library" in _error(
        capsys, ["triton-repo", str(engine), "-o", str(tmp_path / "f")])
    assert "exceeds the engine's profile maximum 16" in _error(
        capsys, ["triton-repo", str(engine), "--max-batch-size", "32", "--trt-plugin",
                 str(corrupt), "-o", str(tmp_path / "g")])
    _fake_engine(engine_dir, onnx_path, "tensorrt_rtx", [], [])
    assert "built with tensorrt_rtx" in _error(
        capsys, ["triton-repo", str(engine), "-o", str(tmp_path / "h")])
    Path(f"{engine}.json").unlink()
    assert "no sidecar" in _error(capsys, ["triton-repo", str(engine), "-o", str(tmp_path / "i")])


def test_force_replaces_only_named_models(repo, tmp_path):
    out, detr = repo
    copy = tmp_path / "repo"
    shutil.copytree(out, copy)
    (copy / "detr_shapes_irpe" / "1" / "stale.txt").write_text("old")
    assert main(["triton-repo", str(detr), "-o", str(copy), "--force",
                 "--max-batch-size", "4"]) == 0
    assert not (copy / "detr_shapes_irpe" / "1" / "stale.txt").exists()
    assert parse(copy / "detr_shapes_irpe" / "config.pbtxt").max_batch_size == 4
    assert parse(copy / "deit_shapes_irpe" / "config.pbtxt").max_batch_size == 8  # kept
    assert not [p for p in copy.iterdir() if p.name.startswith(".")]  # no staging left
    readme = (copy / "README.md").read_text()
    assert "| deit_shapes_irpe |" in readme and "| detr_shapes_irpe |" in readme
