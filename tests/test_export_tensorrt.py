"""TensorRT engines from our ONNX files. With TensorRT-RTX installed (CI) engines are built ahead
of time for SM89 on this CPU-only machine, with and without ENABLE_PLUGIN_OVERRIDE; the runner
test needs a CUDA GPU with TensorRT and is marked gpu."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from export.onnx import export_onnx
from irpe import RPEConfig, create_model
from irpe.artifact.contract import sidecar_path
from irpe.artifact.trained import default_spec, save_trained
from irpe.runtime.tensorrt.build import build_engine
from irpe.runtime.tensorrt.common import TensorRTUnavailable, import_tensorrt, is_rtx
from tests.helpers import tiny_deit
from tests.trt_inspect import engine_plugin_layers

try:
    TRT = import_tensorrt()
    NO_TRT = ""
except TensorRTUnavailable as exc:
    TRT, NO_TRT = None, str(exc)
needs_trt = pytest.mark.skipif(TRT is None, reason=f"no TensorRT module: {NO_TRT}")
needs_rtx = pytest.mark.skipif(TRT is None or not is_rtx(TRT),
                               reason="TensorRT-RTX (ahead-of-time builds) not installed")
AOT = {"compute_capability": "SM89"} if TRT is not None and is_rtx(TRT) else {}


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("trt")
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    deit, spec = tiny_deit(cfg)
    save_trained(deit, str(d / "deit.safetensors"), spec)  # validate() can rebuild it
    small = dict(enc_layers=1, dec_layers=1)
    detr = create_model("detr_tiny_irpe", **small).eval()
    return {"deit": export_onnx(str(d / "deit.safetensors"), d / "deit.onnx"),
            "detr": export_onnx(detr, d / "detr.onnx",
                                spec=default_spec("detr_tiny_irpe", **small))}


@needs_trt
@pytest.mark.parametrize("override", [False, True], ids=["functions", "plugin-override"])
@pytest.mark.parametrize("kind", ["deit", "detr"])
def test_engine_is_built(onnx_files, tmp_path, kind, override, monkeypatch):
    import onnx
    engine = tmp_path / f"{kind}.engine"
    hw = {} if kind == "deit" else {"height": (32, 96, 160), "width": (32, 128, 160)}
    reads, real_load = [], onnx.load
    monkeypatch.setattr(onnx, "load", lambda f, *a, **k: reads.append(f) or real_load(f, *a, **k))
    side = build_engine(onnx_files[kind], engine, batch=(1, 2, 4), plugin_override=override,
                        timing_cache=str(tmp_path / "cache.bin"), **hw, **AOT)
    assert len(reads) == 1  # the metadata, read once for the checks, the ranges and the sidecar
    assert engine.stat().st_size > 100_000
    assert json.loads(sidecar_path(engine).read_text()) == side
    cache = tmp_path / "cache.bin"
    assert (side["timing_cache"] is None) == is_rtx(TRT) and cache.exists() != is_rtx(TRT)
    assert side["plugin_override"] is override and side["plugin_layers"] == []
    assert side["rpe_nodes"] == "local functions inlined by the parser"
    if is_rtx(TRT):  # read from the engine file itself (its compiled-graph records)
        assert engine_plugin_layers(engine)["plugin_layers"] == []
    assert side["tensorrt_module"] == TRT.__name__ and side["precision"] == "fp32"
    assert side["onnx_metadata"]["irpe.task"] == ("classification" if kind == "deit"
                                                  else "detection")
    images = side["profiles"]["images"]
    assert images[0][0] == 1 and images[2][0] == 4
    if kind == "detr":
        assert images[2][2:] == [160, 160] and side["profiles"]["sizes"][1] == [2, 2]
    if AOT:
        assert side["compute_capability"] == "SM89"


@needs_trt
def test_engine_from_inlined_file(onnx_files, tmp_path):
    inlined = export_onnx(str(onnx_files["deit"]).replace(".onnx", ".safetensors"),
                          tmp_path / "inl.onnx", inline=True)
    side = build_engine(inlined, tmp_path / "inl.engine", batch=(1, 1, 2), **AOT)
    assert side["rpe_nodes"] == "inlined at export (--inline file)"
    assert (tmp_path / "inl.engine").stat().st_size > 100_000


_CREATOR_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from irpe.runtime.tensorrt.common import import_tensorrt
    trt = import_tensorrt()
    calls = []
    class Creator(trt.IPluginCreatorV3One):
        def __init__(self, name):
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_namespace, self.plugin_version = name, "irpe", "1"
            self.field_names = trt.PluginFieldCollection([trt.PluginField(
                "num_buckets", np.zeros(1, np.int32), trt.PluginFieldType.INT32)])
        def create_plugin(self, name, fields, phase):
            calls.append((self.name, {f.name: int(f.data[0]) for f in fields}))
            return None  # no kernel here: the parser must report the failure
    for op in ("RPEGather", "RPEScatter"):
        trt.get_plugin_registry().register_creator(Creator(op), "irpe")
    from irpe.runtime.tensorrt.build import build_engine
    try:
        build_engine(sys.argv[1], sys.argv[2], plugin_override=sys.argv[3] == "1", **%s)
    except ValueError as exc:
        print("ERROR", exc)
    print("CALLS", calls)
""")


@needs_trt
@pytest.mark.parametrize("override", ["0", "1"])
def test_registered_irpe_creator_is_consulted(onnx_files, tmp_path, override):
    """A creator named irpe::RPEGather v1 gets the node (with num_buckets) even without the
    override flag, because the nodes carry plugin_namespace; it is not silently bypassed."""
    script = _CREATOR_SCRIPT % repr(AOT)
    res = subprocess.run([sys.executable, "-c", script, str(onnx_files["deit"]),
                          str(tmp_path / "x.engine"), override],
                         capture_output=True, text=True, timeout=300)
    assert "CALLS [('RPEGather', {'num_buckets': 50})]" in res.stdout, res.stdout + res.stderr
    assert "ERROR TensorRT could not parse" in res.stdout and "Could not create the plugin" \
        in res.stdout
    assert not (tmp_path / "x.engine").exists()


@needs_rtx
def test_rtx_options_errors(onnx_files, tmp_path):
    with pytest.raises(ValueError, match="strongly typed"):
        build_engine(onnx_files["deit"], tmp_path / "e", precision="fp16", **AOT)
    with pytest.raises(ValueError, match="unknown compute capability 'SM90'"):
        build_engine(onnx_files["deit"], tmp_path / "e", compute_capability="SM90")
    with pytest.raises(FileNotFoundError, match="plugin library not found"):
        build_engine(onnx_files["deit"], tmp_path / "e", plugins=["/nope/libx.so"], **AOT)
    with pytest.raises(ValueError, match="batch needs min <= opt <= max"):
        build_engine(onnx_files["deit"], tmp_path / "e", batch=(4, 2, 8), **AOT)


def test_clear_error_without_any_tensorrt_module(onnx_files):
    blocked = "tensorrt", "tensorrt_rtx_bindings", "tensorrt_rtx"
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            "from irpe.cli import main\n"
            f"sys.exit(main(['build-engine', {str(onnx_files['deit'])!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2
    assert "irpe build-engine: error: no TensorRT module importable" in res.stderr
    assert "pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings" in res.stderr


@pytest.mark.gpu
@needs_trt
@pytest.mark.skipif(not torch.cuda.is_available(), reason="TRTRunner needs a CUDA GPU")
def test_runner_matches_pytorch_on_gpu(onnx_files, tmp_path):
    from export.validate import validate
    from irpe.runtime.tensorrt.runner import TRTRunner
    engine = tmp_path / "deit.engine"
    build_engine(onnx_files["deit"], engine, batch=(1, 2, 4))
    runner = TRTRunner(engine)
    assert runner.input_names == ["images"] and runner.output_names == ["logits"]
    report = validate(engine, source=None, num_inputs=4, precision="tf32")
    assert report["passed"], report
