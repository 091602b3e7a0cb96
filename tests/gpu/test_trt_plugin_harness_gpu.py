"""The TensorRT plugin libraries executed on the GPU without TensorRT (tests/trt_harness): every
plugin node of an exported DeiT iRPE-QKV file and of the on-the-fly node file, in fp32/fp16/bf16
with int64/int32 ids, through registry -> createPlugin -> build calls -> serialisation round trip
-> enqueue on device buffers; the built, deserialized and cloned plugins' outputs are bitwise
identical (checked by the harness) and equal irpe.ops' (gathers bitwise, scatters within
fp32-accumulation tolerance). Needs a CUDA GPU, nvcc and the TensorRT headers (TENSORRT_ROOT or
../shared/third_party/tensorrt-11.1); no TensorRT library."""
from __future__ import annotations

import pytest
import torch

from tests.trt_harness import cases as harness
from tests.trt_plugin_env import ROOT, require
from tools import trt_plugin_build

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def run_whole(tmp_path_factory):
    require(trt_plugin_build.unavailable_reason(need_runtime=False))
    major, minor = torch.cuda.get_device_capability()
    build = harness.build(ROOT / "build" / "test-trt-harness", archs=f"{major}{minor}",
                          headers=trt_plugin_build.find_headers())
    d = tmp_path_factory.mktemp("harness_gpu")
    cases = harness.write_cases(d / "cases", harness.export_deit_qkv(d / "deit_qkv.onnx"),
                                harness.write_grid_onnx(d / "grid_nodes.onnx"))
    return build, cases


@pytest.mark.parametrize("how", ["dynamic", "static"])
def test_plugin_enqueue_matches_pytorch(run_whole, how):
    build, cases = run_whole
    proc, passed, failed = harness.run(build, how, cases, device=True)
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and failed == 0 and not fails, proc.stdout[-3000:] + proc.stderr
    assert proc.stdout.count("identical output") == len(cases)
    for case in cases:
        harness.assert_matches_reference(case)
        (case.folder / "out.bin").unlink()  # the next library's run must write its own
