"""The lent GPU machine's image, emulated on CPU: exactly the packages it has (GPU_IMAGE, with
what they require) plus the wheels `make gpu-carry` sends (SERVING, downloaded without their
dependencies) are importable (tests/blocked_imports). A module the server imports that neither
brings fails here, not in the one 15-minute GPU window (fastapi-offline, needed by /docs since
2026-11-23, was missing from the carry until this test)."""
from __future__ import annotations

import functools
import importlib.metadata as md
import os
import re
import subprocess
import sys
from typing import Dict, FrozenSet, Iterable, Set

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from scripts.gpu_carry import GPU_IMAGE, SERVING
from tests.helpers import BLOCKER, ROOT

# the GPU machine's interpreter, for the markers of Requires-Dist (python_version < "3.13", ...)
GPU_PYTHON = dict(default_environment(), python_version="3.12", python_full_version="3.12.3",
                  sys_platform="linux", platform_system="Linux", platform_machine="x86_64")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(name: str) -> Set[str]:
    """The distributions ``name`` requires on the GPU machine (no extras), as installed here."""
    out = set()
    for line in md.requires(name) or ():
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(dict(GPU_PYTHON, extra="")):
            out.add(_norm(req.name))
    return out


def _closure(roots: Iterable[str]) -> Set[str]:
    """``roots`` and everything they require, over the distributions installed here."""
    seen: Set[str] = set()
    todo = [_norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(_requires(name) - seen)
        except md.PackageNotFoundError:
            pass  # not installed here (a CUDA-only dependency of torch): nothing to follow
    return seen


@functools.lru_cache(maxsize=1)
def _image() -> FrozenSet[str]:
    """The distributions on the GPU image: GPU_IMAGE and what they require (walked once)."""
    return frozenset(_closure(GPU_IMAGE))


def _gpu_image_env() -> Dict[str, str]:
    """Environment of a process that sees only the GPU image and the carried wheels."""
    only = _image() | {_norm(n) for n in SERVING} | {"irpe-deploy"}
    return dict(os.environ, PYTHONPATH=f"{BLOCKER}{os.pathsep}{ROOT}",
                IRPE_TEST_ONLY_DISTS=",".join(sorted(only)),
                # pytest plugins installed here (schemathesis, ...) are not on the image
                PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")


def test_carried_wheels_bring_what_they_require():
    """SERVING is downloaded with --no-deps: each wheel's own requirements must be carried too or
    already be on the image."""
    image = _image()
    carried = {_norm(n) for n in SERVING}
    missing = {name: sorted(_requires(name) - carried - image) for name in sorted(carried)}
    assert not {k: v for k, v in missing.items() if v}, missing


def test_the_emulation_refuses_what_the_image_lacks():
    """The emulation is real: a package installed here but not on the image (nor carried) cannot
    be imported, a carried one and a namespace part on the image can."""
    code = ("import fastapi_offline, simdjson, opentelemetry.trace\n"
            "try:\n    import opentelemetry.sdk.trace\nexcept ModuleNotFoundError as e:\n"
            "    print('refused', e.name)\n"
            "try:\n    import openvino\nexcept ModuleNotFoundError as e:\n"
            "    print('refused', e.name)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_gpu_image_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    assert lines[0].startswith("refused opentelemetry.sdk") and lines[1] == "refused openvino"


def test_gpu_tests_collect_on_the_gpu_image():
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--collect-only", "tests/gpu"], cwd=ROOT, env=_gpu_image_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert re.search(r"^\d{2,} tests collected", done.stdout, re.M), done.stdout[-2000:]


@pytest.mark.slow
def test_bench_serve_step_runs_on_the_gpu_image(tmp_path):
    """gpu-check's bench/serve step (`irpe bench serve --quick --backend torch`), on the CPU: the
    server, its /docs assets and the load generator import nothing the image and carry lack."""
    done = subprocess.run([sys.executable, "-m", "irpe", "bench", "serve", "--quick",
                           "--backend", "torch", "--device", "cpu", "--concurrency", "2",
                           "--images-per-request", "1", "--out", str(tmp_path)],
                          cwd=ROOT, env=_gpu_image_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (tmp_path / "bench_serve.json").is_file() and (tmp_path / "bench_serve.md").is_file()
