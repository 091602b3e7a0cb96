"""TensorRT engines WITH the iRPE plugin, run on the GPU against PyTorch (DeiT iRPE-QKV, DETR).

Needs a CUDA GPU, a TensorRT Python module that can build for it (full TensorRT, or TensorRT-RTX
on SM75-SM121 but not SM90) and TensorRT headers of the same major (NGC image, TENSORRT_ROOT);
skipped otherwise, with the reason. Never run by this project so far: no such machine was lent."""
from __future__ import annotations

import pytest
import torch

from export.onnx import export_onnx
from irpe import RPEConfig, create_model
from irpe.artifact.trained import default_spec
from irpe.runtime.tensorrt.build import build_engine
from irpe.runtime.tensorrt.common import TensorRTUnavailable, import_tensorrt, is_rtx
from tests.helpers import tiny_deit
from tests.trt_inspect import engine_plugin_layers
from tests.trt_plugin_env import BUILD_DIR
from tools import trt_plugin_build

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU")]


def _headers_major() -> int:
    text = (trt_plugin_build.find_headers() / "NvInferVersion.h").read_text()
    for key in ("TRT_MAJOR_ENTERPRISE", "NV_TENSORRT_MAJOR"):
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[:2] == ["#define", key] and parts[2].isdigit():
                return int(parts[2])
    return -1


@pytest.fixture(scope="module")
def setup():
    try:
        trt = import_tensorrt()
    except TensorRTUnavailable as exc:
        pytest.skip(str(exc))
    reason = trt_plugin_build.unavailable_reason(need_runtime=is_rtx(trt))
    if reason:
        pytest.skip(reason)
    major, cc = _headers_major(), torch.cuda.get_device_capability()
    expected = 11 if is_rtx(trt) else int(trt.__version__.split(".")[0])
    if major != expected:
        pytest.skip(f"TensorRT headers are {major}.x, {trt.__name__} {trt.__version__} needs "
                    f"{expected}.x headers")
    if is_rtx(trt) and cc == (9, 0):
        pytest.skip("TensorRT-RTX has no SM90 target")
    build = trt_plugin_build.build_plugins(BUILD_DIR, archs=f"{cc[0]}{cc[1]}",
                                    runtime="tensorrt_rtx" if is_rtx(trt) else "tensorrt")
    return trt, str(build["library"])


def _run(trt, plugin, model, onnx, tmp_path, feeds, **ranges):
    from irpe.runtime.tensorrt.runner import TRTRunner
    engine = tmp_path / "model.engine"
    aot = {"compute_capability": "current"} if is_rtx(trt) else {}
    side = build_engine(onnx, engine, plugins=[plugin], **ranges, **aot)
    assert side["rpe_nodes"] == "plugin"
    found = engine_plugin_layers(engine, trt)
    assert found is not None and len(found["plugin_layers"]) == len(side["plugin_layers"]) > 0
    runner = TRTRunner(engine, plugins=[plugin])
    out = runner(**{k: v.cuda() for k, v in feeds.items()})
    torch.cuda.synchronize()
    with torch.no_grad():
        ref = model(*feeds.values())
    return out, ref


def test_deit_qkv_plugin_engine_matches_pytorch(setup, tmp_path):
    trt, plugin = setup
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    model, spec = tiny_deit(cfg)
    onnx = export_onnx(model, tmp_path / "deit.onnx", spec=spec)
    images = torch.randn(2, 3, spec.preprocess["size"], spec.preprocess["size"])
    out, ref = _run(trt, plugin, model, onnx, tmp_path, {"images": images}, batch=(1, 2, 4))
    torch.testing.assert_close(out["logits"].float().cpu(), ref, atol=1e-3, rtol=1e-3)


def test_detr_plugin_engine_matches_pytorch(setup, tmp_path):
    trt, plugin = setup
    small = dict(enc_layers=1, dec_layers=1)
    model = create_model("detr_tiny_irpe", **small).eval()
    onnx = export_onnx(model, tmp_path / "detr.onnx", spec=default_spec("detr_tiny_irpe", **small))
    images = torch.randn(1, 3, 64, 96)
    sizes = torch.tensor([[64, 96]], dtype=torch.int64)
    out, ref = _run(trt, plugin, model, onnx, tmp_path, {"images": images, "sizes": sizes},
                    batch=(1, 1, 2), height=(32, 64, 96), width=(32, 96, 128))
    ref = ref if isinstance(ref, dict) else dict(zip(out, ref, strict=True))
    for name, value in out.items():
        torch.testing.assert_close(value.float().cpu(), ref[name].float(), atol=1e-3, rtol=1e-3)
