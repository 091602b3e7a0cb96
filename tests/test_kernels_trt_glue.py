"""The TensorRT plugin glue (plugins/tensorrt) compiled with g++ against the real TensorRT
headers (TENSORRT_ROOT, or ../shared/third_party/tensorrt-11.1 in CI: no hand-written copy of the
API exists to drift) with fakes only for what a test must observe: the kernels' C ABI, the
runtime version, the plugin registry, a logger. Covers creators and their per-mode fields, the
static registrar, validation and logging, output shapes and types, formats, the serialization
round trip, enqueue arguments, and the refusal to register in a runtime of another major."""
import re
import subprocess

import pytest

from tests.trt_plugin_env import ROOT, require
from tools import trt_plugin_build

SOURCES = ["plugins/tensorrt/rpe_fields.cpp", "plugins/tensorrt/rpe_plugin.cpp",
           "plugins/tensorrt/register.cpp", "tests/trt_glue/glue_driver.cpp"]


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    require(trt_plugin_build.unavailable_reason(need_runtime=False))
    exe = tmp_path_factory.mktemp("glue") / "glue"
    build = subprocess.run(
        ["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-DIRPE_STATIC_REGISTRATION",
         "-isystem", str(trt_plugin_build.find_headers()),
         "-isystem", str(trt_plugin_build.cuda_include()),
         "-Itests/trt_glue", "-Iplugins/kernels", "-Iplugins/tensorrt", *SOURCES, "-o", str(exe)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    return exe


def _counts(stdout):
    return tuple(map(int, re.search(r"(\d+) passed, (\d+) failed", stdout).groups()))


def test_plugin_glue(glue):
    run = subprocess.run([str(glue)], capture_output=True, text=True, timeout=60)
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert run.returncode == 0 and not failed, run.stdout
    passed, nfailed = _counts(run.stdout)
    assert passed >= 40 and nfailed == 0
    assert run.stderr == ""  # with a logger finder set, errors go to TensorRT's logger


@pytest.mark.parametrize("version", ["100700", "10701", "120000"])
def test_refuses_a_runtime_of_another_major(glue, version):
    run = subprocess.run([str(glue), "abi"], capture_output=True, text=True, timeout=60,
                         env={"IRPE_FAKE_TRT_VERSION": version})
    assert run.returncode == 0 and _counts(run.stdout) == (3, 0), run.stdout + run.stderr
    first = run.stderr.splitlines()[0]
    assert first.startswith("[irpe plugin] refusing to register: compiled with TensorRT 11.")
    assert f"reports version {version} (major {int(version) // 10000})" in first
    assert "rebuild the plugin against this TensorRT's headers" in first
