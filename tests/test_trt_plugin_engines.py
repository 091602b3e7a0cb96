"""TensorRT-RTX engines built WITH the iRPE plugin library, ahead of time for SM89 on this
CPU-only machine: the library is built by CMake against the real TensorRT 11.1 headers
(../shared/third_party in CI; TENSORRT_ROOT elsewhere), each build runs in a plain process
(`irpe build-engine --plugin`, or build_engine's isolated child), and the plugin layers are read
back from the engine file itself. Skipped with the reason on a clone without headers or
TensorRT-RTX; never skipped under CI=true."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from export.onnx import export_onnx
from irpe import RPEConfig, create_model
from irpe.artifact.trained import default_spec
from irpe.runtime.tensorrt.build import build_engine
from irpe.runtime.tensorrt.common import TensorRTUnavailable, import_tensorrt, is_rtx
from tests.helpers import tiny_deit
from tests.trt_inspect import engine_plugin_layers
from tests.trt_plugin_env import ROOT, build_or_skip, require

AOT = {"compute_capability": "SM89"}
DETR_HW = {"height": (32, 64, 96), "width": (32, 96, 128)}


def _rtx_reason():
    try:
        return None if is_rtx(import_tensorrt()) else "TensorRT-RTX is not the TensorRT module"
    except TensorRTUnavailable as exc:
        return str(exc)


@pytest.fixture(scope="module")
def plugin():
    require(_rtx_reason())
    build = build_or_skip()
    print(f"plugin library built in {build['seconds']:.1f} s")
    return str(build["library"])


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin_onnx")
    files = {}
    for on in ("k", "qkv"):
        cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on=on)
        model, spec = tiny_deit(cfg)
        files[on] = export_onnx(model, d / f"deit_{on}.onnx", spec=spec)
    small = dict(enc_layers=1, dec_layers=1)
    detr = create_model("detr_tiny_irpe", **small).eval()
    files["detr"] = export_onnx(detr, d / "detr.onnx", spec=default_spec("detr_tiny_irpe", **small))
    return files


def _irpe_warnings(side):
    return [m for m in side["build_warnings"] if "plugin node" in m or "irpe" in m.lower()]


def _check_plugin_engine(engine: Path, side: dict, gathers: int, scatters: int) -> dict:
    found = engine_plugin_layers(engine)
    assert found is not None and found["plugin_layers"] == sorted(side["plugin_layers"])
    assert found["plugin_type_records"] == found["plugin_layers"]
    layers = found["plugin_layers"]
    assert sum(n.endswith("RPEGather") for n in layers) == gathers, layers
    assert sum(n.endswith("RPEScatter") for n in layers) == scatters, layers
    assert side["rpe_nodes"] == "plugin" and side["compute_capability"] == "SM89"
    assert "irpe::RPEGather" in side["plugin_creators"]
    assert _irpe_warnings(side) == [], side["build_warnings"]
    return found


def test_irpe_build_engine_cli_with_plugin(plugin, onnx_files, tmp_path):
    """DeiT iRPE-K through the console command, in a process with no LD_LIBRARY_PATH help."""
    engine = tmp_path / "k.engine"
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "irpe.cli", "build-engine", str(onnx_files["k"]),
                          "-o", str(engine), "--plugin", plugin, "--compute-capability", "SM89",
                          "--batch", "1,2,4"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "rpe: plugin" in res.stdout and "rpe plugin layers: 2" in res.stderr
    side = json.loads(Path(f"{engine}.json").read_text())
    _check_plugin_engine(engine, side, gathers=2, scatters=0)
    print(f"K: {engine.stat().st_size / 1e6:.1f} MB, {side['build_seconds']} s in the child, "
          f"{time.perf_counter() - start:.1f} s with the process")


def test_qkv_engine_gathers_and_scatters(plugin, onnx_files, tmp_path):
    engine = tmp_path / "qkv.engine"
    side = build_engine(onnx_files["qkv"], engine, batch=(1, 2, 4), plugins=[plugin], **AOT)
    found = _check_plugin_engine(engine, side, gathers=4, scatters=2)
    # the iRPE-Q term: a gather of the 1-row table, outside the rpe_k / rpe_v modules
    q_terms = [n for n in found["plugin_layers"] if n.endswith("/attn/RPEGather")]
    assert len(q_terms) == 2, found["plugin_layers"]
    print(f"QKV: {engine.stat().st_size / 1e6:.1f} MB, {side['build_seconds']} s, "
          f"warnings {len(side['build_warnings'])}")


def test_detr_engine_dynamic_hw(plugin, onnx_files, tmp_path):
    engine = tmp_path / "detr.engine"
    side = build_engine(onnx_files["detr"], engine, batch=(1, 1, 2), plugins=[plugin],
                        **DETR_HW, **AOT)
    _check_plugin_engine(engine, side, gathers=1, scatters=0)
    assert side["profiles"]["images"] == [[1, 3, 32, 32], [1, 3, 64, 96], [2, 3, 96, 128]]
    print(f"DETR: {engine.stat().st_size / 1e6:.1f} MB, {side['build_seconds']} s")


_STATIC = """
import ctypes, sys
from irpe.runtime.tensorrt.common import import_tensorrt
registry = import_tensorrt().get_plugin_registry()
before = {(c.name, c.plugin_namespace) for c in registry.all_creators}
lib = ctypes.CDLL(sys.argv[1])
print(sorted(f"{ns}::{n}" for n, ns in {(c.name, c.plugin_namespace)
                                        for c in registry.all_creators} - before))
print(hasattr(lib, "getCreators"), hasattr(lib, "setLoggerFinder"),
      hasattr(lib, "irpe_trt_plugin_abi"), hasattr(lib, "irpe_gather"))
"""


def test_static_library_registers_on_load(plugin):
    """libirpe_trt_plugins_static.so (same CMake build) registers its creators under irpe when
    loaded with ctypes (trtexec --staticPlugins, polygraphy --plugins); exported C symbols."""
    static = str(Path(plugin).with_name("libirpe_trt_plugins_static.so"))
    res = subprocess.run([sys.executable, "-c", _STATIC, static], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "['irpe::RPEGather', 'irpe::RPEGatherGrid', 'irpe::RPEScatter', 'irpe::RPEScatterGrid']",
        "True True True True"], res.stdout


def test_function_inlined_engine_has_no_plugin_layer(onnx_files, tmp_path):
    require(_rtx_reason())
    engine = tmp_path / "fn.engine"
    side = build_engine(onnx_files["qkv"], engine, batch=(1, 2, 4), **AOT)
    assert side["rpe_nodes"] == "local functions inlined by the parser"
    found = engine_plugin_layers(engine)
    assert found is not None and found["plugin_layers"] == [] == found["plugin_type_records"]


def _wrong_major_library(plugin: str, out: Path) -> str:
    """The plugin sources linked like CMake does, but accepting runtime major 11 (libnvinfer
    11) only; the kernels come from the CMake build's libirpe_kernels.so."""
    from tools.trt_plugin_build import cuda_include, find_headers, rtx_library_dir
    lib, folder = out / "libwrong_major.so", Path(plugin).parent
    cmd = ["g++", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-O1",
           "-DIRPE_TRT_RUNTIME_MAJOR=11", "-isystem", str(find_headers()),
           "-isystem", str(cuda_include()), "-Iplugins/kernels", "-Iplugins/tensorrt",
           *(f"plugins/tensorrt/{n}.cpp" for n in ("rpe_fields", "rpe_plugin", "register")),
           "-o", str(lib), f"-L{folder}", "-lirpe_kernels", f"-Wl,-rpath,{folder}",
           str(rtx_library_dir() / "libtensorrt_rtx.so.1")]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return str(lib)


def test_library_for_another_major_is_refused(plugin, onnx_files, tmp_path):
    """Built for runtime major 11 (libnvinfer 11), loaded by TensorRT-RTX (major 1): the
    library registers nothing and the build fails with one line, exit status 2."""
    wrong = _wrong_major_library(plugin, tmp_path)
    res = subprocess.run([sys.executable, "-m", "irpe.cli", "build-engine", str(onnx_files["k"]),
                          "-o", str(tmp_path / "x.engine"), "--plugin", wrong,
                          "--compute-capability", "SM89"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    lines = [line for line in res.stderr.splitlines() if line.startswith("irpe build-engine")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "compiled with TensorRT 11.1 headers for runtime major 11, but " \
           "tensorrt_rtx_bindings 1.7" in lines[0] and "rebuild it" in lines[0]
    assert "[irpe plugin] refusing to register" in res.stderr  # the library's own message
    assert not (tmp_path / "x.engine").exists()


def test_aborting_build_is_one_error_line(plugin, onnx_files, tmp_path, monkeypatch, capsys):
    """Without the libtensorrt_rtx.so link the parser's dlopen aborts the build process: the
    caller survives: EngineBuildError naming the signal, through the CLI one line, exit 1."""
    import irpe.runtime.tensorrt.isolate as isolate
    monkeypatch.setattr(isolate, "wheel_library_dirs", lambda: [])
    from irpe.cli import main
    code = main(["build-engine", str(onnx_files["k"]), "-o", str(tmp_path / "b.engine"),
                 "--plugin", plugin, "--compute-capability", "SM89"])
    errors = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("irpe build-engine: error:")]
    assert code == 1 and len(errors) == 1, errors
    assert errors[0].startswith("irpe build-engine: error: the TensorRT build process died "
                                "(signal SIGABRT)"), errors[0]
    assert not (tmp_path / "b.engine").exists()


def test_isolated_build_errors_keep_their_type(plugin, onnx_files, tmp_path):
    """Errors raised in the build process reach the caller as the same kind of exception."""
    with pytest.raises(ValueError, match="strongly typed networks"):
        build_engine(onnx_files["k"], tmp_path / "e", precision="fp16", plugins=[plugin], **AOT)
    with pytest.raises(FileNotFoundError, match="plugin library not found"):
        build_engine(onnx_files["k"], tmp_path / "e", plugins=[str(tmp_path / "no.so")], **AOT)
    with pytest.raises(ValueError, match="not found"):  # the ONNX file, checked in the child
        build_engine(tmp_path / "none.onnx", tmp_path / "e", plugins=[plugin], **AOT)
    assert not (tmp_path / "e").exists()
