"""The image scripts' decisions that need no Docker engine (the image itself is built and probed
by `make docker-test`, tests/docker_probe.py): the GPU install path stops before any download
on a machine without CUDA/TensorRT, an empty wheelhouse is refused, and docker-test skips
without an engine except under CI=true."""
from __future__ import annotations

import os
import subprocess

from tests.helpers import ROOT


def _run(argv, **env):
    """Run a script of the checkout with a minimal environment plus ``env``."""
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**base, **env})


def test_gpu_install_stops_before_any_download_naming_what_is_missing(tmp_path):
    venv = tmp_path / "venv"
    done = _run(["scripts/install.sh"], VARIANT="gpu", VENV=str(venv), CUDACXX="/nonexistent/nvcc")
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip()
    assert line.startswith("install.sh: error: VARIANT=gpu needs CUDA and TensorRT"), line
    assert "nvcc (CUDA toolkit)" in line and "NGC TensorRT image" in line
    assert len(line.splitlines()) == 1
    assert not venv.exists() and "==>" not in done.stdout   # nothing made, nothing downloaded


def test_an_empty_wheelhouse_is_refused(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    done = _run(["scripts/install.sh"], WHEELHOUSE=str(wheelhouse), PYTHON="python3",
                TORCH="torch==2.13.0")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"install.sh: error: WHEELHOUSE={wheelhouse} has no wheels "
                                   "(scripts/docker-wheelhouse.sh makes it)")


def test_docker_test_skips_without_an_engine_but_fails_in_ci():
    # a client that reaches no engine, and no dockerd on PATH to start one
    no_engine = {"DOCKER": "/bin/false", "PATH": "/bin"}
    skipped = _run(["bash", "scripts/docker-test.sh"], **no_engine)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.strip() == ("docker-test: skipped: no engine answers and dockerd is "
                                      "not installed (apt-get install docker.io)")
    failed = _run(["bash", "scripts/docker-test.sh"], CI="true", **no_engine)
    assert failed.returncode == 1
    assert failed.stderr.strip() == ("docker-test: error: no engine answers and dockerd is not "
                                     "installed (apt-get install docker.io)")


def test_requirements_per_variant_are_pyprojects_without_torch():
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    listed = {v: _run(["python3", "scripts/requirements.py", v]).stdout.split()
              for v in ("cpu", "gpu")}
    deps = [r for r in project["dependencies"] if not r.startswith("torch")]
    assert listed["cpu"] == list(dict.fromkeys(deps + extras["serve"] + extras["export"]
                                               + extras["openvino"]))  # the CPU default
    assert not any(r.startswith("nncf") for r in listed["cpu"])  # the quantiser stays out
    assert listed["gpu"] == list(dict.fromkeys(deps + extras["serve"] + extras["gpu"]
                                               + ["onnx>=1.16"]))
    assert not any(r.startswith("onnxruntime>") for r in listed["gpu"])   # never beside -gpu
    build = _run(["python3", "scripts/requirements.py", "cpu", "--build"]).stdout.split()
    assert build[-2:] == ["setuptools>=68", "wheel"]
    bad = _run(["python3", "scripts/requirements.py", "tpu"])
    assert bad.returncode == 1 and bad.stderr.strip() == "usage: requirements.py cpu|gpu [--build]"
