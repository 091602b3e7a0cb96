"""`backend: auto` (every model's default) and the demo's `--backend auto`: the backend a
model's file and device call for, OpenVINO for ONNX files on the CPU where it is installed,
ONNX Runtime where it is not (checked in a process that cannot import openvino) or on CUDA;
what `irpe serve --prepare` reports for the demo models both ways."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from serve.config import ModelConfig
from tests.helpers import BLOCKER, ROOT
from tests.openvino_common import needs_openvino


@needs_openvino
@pytest.mark.parametrize("path, device, backend", [
    ("m.onnx", "cpu", "openvino"),
    ("m.ONNX", "cpu", "openvino"),
    ("m.onnx", "cuda", "onnxruntime"),
    ("m.xml", "cpu", "openvino"),
    ("m.engine", "cuda", "tensorrt"),
    ("m.plan", "cuda:1", "tensorrt"),
    ("m.safetensors", "cpu", "torch"),
    ("m.safetensors", "cuda", "torch"),
])
def test_auto_picks_the_backend_of_the_file(path, device, backend):
    cfg = ModelConfig(name="m", path=path, device=device)
    assert cfg.backend == backend
    assert ModelConfig(name="m", path=path, device=device, backend="auto").backend == backend


def test_a_named_backend_is_kept_and_a_wrong_one_lists_auto():
    assert ModelConfig(name="m", path="m.onnx", backend="onnxruntime").backend == "onnxruntime"
    with pytest.raises(ValidationError, match="auto"):
        ModelConfig(name="m", path="m.onnx", backend="openvno")


def _irpe(*args: str, blocked: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BLOCKER, str(ROOT)]),
               IRPE_TEST_BLOCKED=blocked)
    for name in ("IRPE_SERVE_REPOSITORY", "IRPE_SERVE_MODELS"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "irpe", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


@needs_openvino
def test_the_demo_runs_on_openvino_by_default_and_on_onnxruntime_without_it():
    """What `make run` serves: OpenVINO (make run installs it); the same command on a machine
    without openvino serves ONNX Runtime, nothing else to configure."""
    args = ("serve", "--prepare", "--threads", "1", "--log-level", "error")
    for blocked, backend in (("", "openvino"), ("openvino", "onnxruntime")):
        done = _irpe(*args, blocked=blocked)
        assert done.returncode == 0, done.stderr
        rows = [line.split() for line in done.stdout.splitlines()[1:]]
        assert [r[:4] for r in rows] == [
            ["deit_shapes_irpe", "classification", backend, "ready"],
            ["detr_shapes_irpe", "detection", backend, "ready"]], done.stdout


def test_auto_without_openvino_resolves_to_onnxruntime():
    code = ("from serve.config import ModelConfig; "
            "print(ModelConfig(name='m', path='m.onnx').backend)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(
                              os.environ, PYTHONPATH=os.pathsep.join([BLOCKER, str(ROOT)]),
                              IRPE_TEST_BLOCKED="openvino"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "onnxruntime"
