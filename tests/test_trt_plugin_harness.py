"""The TensorRT plugin libraries driven without TensorRT, up to enqueue (CI has no GPU).

tests/trt_harness builds plugins/CMakeLists.txt's own plugin targets linked against a runtime
shim (tests/trt_harness/shim.cpp) in place of libnvinfer, and runs them as TensorRT would: the
registry, every plugin node of an exported DeiT iRPE-QKV file and of the on-the-fly node file in
fp32/fp16/bf16 (and int64/int32 ids), shapes, formats, configure, workspace, the serialisation
round trip, attachToContext and clone, onShapeChange. Without a CUDA device enqueue must fail
with a logged error, not abort. tests/gpu/test_trt_plugin_harness_gpu.py runs the same cases
whole and compares the outputs with irpe.ops. Skipped without TensorRT headers or nvcc, except
under CI=true, where that fails."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from tests.trt_harness import cases as harness
from tests.trt_plugin_env import ROOT, require
from tools import trt_plugin_build

BUILD_DIR = ROOT / "build" / "test-trt-harness"


@pytest.fixture(scope="module")
def built():
    require(trt_plugin_build.unavailable_reason(need_runtime=False))
    build = harness.build(BUILD_DIR, archs="90", headers=trt_plugin_build.find_headers())
    print(f"harness + plugin libraries built in {build['seconds']:.1f} s")
    return build


@pytest.fixture(scope="module")
def all_cases(tmp_path_factory):
    d = tmp_path_factory.mktemp("harness")
    deit = harness.export_deit_qkv(d / "deit_qkv.onnx")
    grid = harness.write_grid_onnx(d / "grid_nodes.onnx")
    return harness.write_cases(d / "cases", deit, grid)


def _undefined(lib) -> set:
    out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    # versioned symbols come from libc / libstdc++ / libgcc / libcudart; weak ones are optional
    return {p[1] for p in (line.split() for line in out.splitlines())
            if len(p) == 2 and p[0] == "U" and "@" not in p[1]}


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) not found")
def test_shim_exports_exactly_what_the_plugins_import(built):
    """The shim stands in for libnvinfer with only the symbols the libraries import from it."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(built["shim"])], capture_output=True,
                         text=True, check=True).stdout
    exported = {line.split()[2] for line in out.splitlines() if line.split()[1] in "TWDBR"}
    assert _undefined(built["library"]) == {"getInferLibVersion"}
    assert _undefined(built["static"]) == {"getInferLibVersion", "getPluginRegistry"}
    assert exported == {"getInferLibVersion", "getPluginRegistry"}, exported
    needed = subprocess.run(["readelf", "-d", str(built["library"])], capture_output=True,
                            text=True, check=True).stdout
    assert "[libnvinfer.so.11]" in needed  # where a TensorRT 11 build's dependency would be


def test_cases_cover_every_mode_and_dtype(all_cases):
    kinds = {(c.op_type, str(c.expected.dtype)) for c in all_cases}
    ops = ("RPEGather", "RPEScatter", "RPEGatherGrid", "RPEScatterGrid")
    assert kinds == {(op, str(t)) for op in ops
                     for t in (torch.float32, torch.float16, torch.bfloat16)}
    names = {c.folder.name for c in all_cases}
    methods = {re.sub(r"\d+$", "", n.split("_", 1)[1].rsplit("_", 1)[0])
               for n in names if "Grid" in n}
    assert methods == {m for m, *_ in harness.GRIDS} == {"euc", "quant", "product", "cross_rows",
                                                         "cross_cols"}
    assert sum("RPEGather" in n and n.endswith("int32") for n in names) == 6  # K and 1-row Q


@pytest.mark.parametrize("how", ["dynamic", "static"])
def test_harness_up_to_enqueue(built, all_cases, how):
    proc, passed, failed = harness.run(built, how, all_cases, device=False)
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and failed == 0 and not fails, proc.stdout[-3000:] + proc.stderr
    per_case = 18 if torch.cuda.is_available() else 19  # + enqueue without a device
    assert passed == 3 + (how == "dynamic") * 2 + per_case * len(all_cases), \
        proc.stdout[-2000:]
    if not torch.cuda.is_available():
        assert proc.stdout.count("enqueue returns an error and logs it") == len(all_cases)


def test_harness_reports_a_wrong_shape(built, all_cases, tmp_path):
    """The harness can fail: a case expecting another output shape is reported, not passed."""
    case = next(c for c in all_cases if c.op_type == "RPEScatter")
    bad = tmp_path / case.folder.name
    shutil.copytree(case.folder, bad)
    text = (bad / "case.txt").read_text()
    (bad / "case.txt").write_text(re.sub(r"^(output \S+ 4 \d+ \d+ \d+) \d+", r"\1 7", text,
                                         flags=re.M))
    proc, _, failed = harness.run(built, "dynamic", [harness.Case(bad, case.op_type,
                                                                  case.expected)], device=False)
    assert proc.returncode == 1 and failed == 1
    assert re.search(r"^FAIL .*getOutputShapes \[2,2,26,7\] \(\[2,2,26,50\]\)", proc.stdout, re.M)
