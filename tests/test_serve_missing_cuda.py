"""A model on a CUDA device the machine lacks is refused when `irpe serve` starts, with one line
and exit 2, exactly as an unknown device (`tpu`) is: not a server whose readiness stays 503.
`cuda:<device count>` is missing on every machine; plain `cuda` where torch sees no GPU."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from serve.app import cuda_device_count
from tests.helpers import ROOT

MISSING = f"cuda:{cuda_device_count()}"


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "irpe", "serve", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def _one_line_exit_2(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done  # main: the server ran with the model never ready
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("irpe serve: error: "), done.stderr
    return lines[0]


def _repository(tmp_path, cls_file, device: str):
    repo = tmp_path / "repo.yaml"
    repo.write_text(f"models:\n  - {{name: m, path: {cls_file}, device: '{device}'}}\n")
    return str(repo)


def test_missing_cuda_device_refused_at_start_like_an_unknown_device(tmp_path, cls_file):
    tpu = _one_line_exit_2(_serve(_repository(tmp_path, cls_file, "tpu")))
    assert "device must be cpu, cuda or cuda:N, got 'tpu'" in tpu
    line = _one_line_exit_2(_serve(_repository(tmp_path, cls_file, MISSING), "--port", "0"))
    count = cuda_device_count()
    have = ("no CUDA device (torch.cuda.is_available() is False)" if count == 0 else
            f"{count} CUDA device")
    assert f"model m: device {MISSING} requested, but this machine has {have}" in line


def test_demo_on_a_missing_device_refused(tmp_path):
    line = _one_line_exit_2(_serve("--backend", "torch", "--device", MISSING, "--prepare"))
    assert f"model deit_shapes_irpe: device {MISSING} requested" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="plain cuda exists on this machine")
def test_plain_cuda_without_cuda(tmp_path, cls_file):
    line = _one_line_exit_2(_serve(_repository(tmp_path, cls_file, "cuda"), "--prepare"))
    assert line == ("irpe serve: error: model m: device cuda requested, but this machine has "
                    "no CUDA device (torch.cuda.is_available() is False); serve it with "
                    "device: cpu")
