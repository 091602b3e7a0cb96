"""`make ort-ops` (Makefile -> plugins/onnxruntime/build.sh --optional), what `make run` and
scripts/install.sh use: without ORT headers or a C++ compiler one skip line and exit 0; with
them the library in ORT_OPS_DIR, up to date until a source changes, registered into onnxruntime.

The build test reuses the session's `ort_library` (tests/conftest.py): make drives CMake in that
tree, so nothing compiles twice; it needs the ORT headers (skips without them, except CI=true)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pytest
import torch

from irpe import bucket_ids, rpe_gather
from irpe.runtime.onnxruntime.session import create_session, default_library
from tests.helpers import ORT_ATTRS, ort_headers, ort_op_model

ROOT = Path(__file__).resolve().parents[1]
LIB = "libirpe_ort_ops.so"
SKIP_TAIL = "; the server runs the iRPE nodes through the ONNX functions"
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not found")


def make(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """`make -s ARGS` in the checkout (ORT_ROOT / ONNXRUNTIME_ROOT only from ``args``)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("ORT_ROOT", "ONNXRUNTIME_ROOT", "MAKEFLAGS", "CXX")}
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=ROOT,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


def skipped(done: subprocess.CompletedProcess) -> str:
    """The reason of a skipped build, checked to be the one line, exit 0, nothing on stderr."""
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ort-ops: skipped, "), done.stdout
    assert lines[0].endswith(SKIP_TAIL)
    return lines[0][len("ort-ops: skipped, "):-len(SKIP_TAIL)]


@pytest.mark.parametrize("root", ["/nonexistent", "empty", "other-header"])
def test_no_headers_one_line_and_exit_0(tmp_path, root):
    """ORT_ROOT missing, empty or without onnxruntime_cxx_api.h, and no shared copy."""
    if root != "/nonexistent":
        (tmp_path / root / "include").mkdir(parents=True)
        if root == "other-header":
            (tmp_path / root / "include" / "onnxruntime_c_api.h").write_text("/* not it */\n")
        root = str(tmp_path / root)
    out = tmp_path / "out"
    done = make("ort-ops", f"ORT_ROOT={root}", "ONNXRUNTIME_ROOT=",
                f"SHARED_DIR={tmp_path / 'no-shared'}", f"ORT_OPS_DIR={out}")
    assert skipped(done).startswith("ONNX Runtime C/C++ headers not found (set ORT_ROOT")
    assert not out.exists()


def test_no_compiler_one_line_and_exit_0(tmp_path):
    """Headers found (a stand-in file is enough to pass detection) but CXX names no program."""
    (tmp_path / "ort" / "include").mkdir(parents=True)
    (tmp_path / "ort" / "include" / "onnxruntime_cxx_api.h").write_text("#error unused\n")
    out = tmp_path / "out"
    done = make("ort-ops", f"ORT_ROOT={tmp_path / 'ort'}", f"ORT_OPS_DIR={out}",
                env={"CXX": str(tmp_path / "no-such-c++")})
    if shutil.which("cmake") is None:
        assert skipped(done) == "cmake not found"
    else:
        assert skipped(done) == f"C++ compiler CXX={tmp_path / 'no-such-c++'} not found"
    assert not out.exists()


@pytest.fixture(scope="module")
def built(ort_library: Path) -> Path:
    """`make ort-ops` into the folder of the session's library, its CMake tree reused: the
    library is moved aside first, so make (through CMake) has to put it back."""
    out, aside = ort_library.parent, ort_library.with_suffix(".aside")
    ort_library.rename(aside)
    try:
        done = make("-B", "ort-ops", f"ORT_ROOT={ort_headers()}", f"ORT_OPS_DIR={out}",
                    f"ORT_OPS_CMAKE={out / 'cmake'}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1] == (f"built: {out / LIB}, "
                                                f"{out / 'libirpe_cpu_attention.so'}"), done.stdout
        assert (out / "libirpe_cpu_attention.so").is_file()
        assert ort_library.is_file()
    finally:
        if not ort_library.exists():
            aside.rename(ort_library)
        aside.unlink(missing_ok=True)
    return ort_library


def test_make_builds_a_library_onnxruntime_runs(built):
    """custom_ops="on": the registered RPEGather, equal to PyTorch's gather and the function."""
    ids = bucket_ids("product", 1.9, 5, 5, skip=1).numpy()
    table = np.random.default_rng(0).standard_normal((2, 3, 26, 50), dtype=np.float32)
    model = ort_op_model("RPEGather", num_buckets=50, **ORT_ATTRS)
    session, path = create_session(model, custom_ops="on", library=built, quiet=True)
    assert path.custom_ops and path.library == str(built)
    got = session.run(None, {"x": table, "index": ids})[0]
    assert np.array_equal(got, rpe_gather(torch.from_numpy(table), torch.from_numpy(ids)).numpy())
    functions, _ = create_session(model, custom_ops="off", quiet=True)
    assert np.array_equal(got, functions.run(None, {"x": table, "index": ids})[0])


@pytest.mark.parametrize("source", [None, "plugins/onnxruntime/rpe_ort_ops.cpp",
                                    "plugins/onnxruntime/rpe_ort.h",
                                    "plugins/onnxruntime/CMakeLists.txt",
                                    "plugins/cpu/rpe_attention_bind.cpp",
                                    "plugins/cpu/rpe_attention.h",
                                    "plugins/cpu/CMakeLists.txt",
                                    "plugins/kernels/irpe_bucket.h",
                                    "plugins/kernels/irpe_methods.h"])
def test_rebuilt_only_when_a_source_changes(built, source):
    """`make -q` (question mode): up to date after the build; out of date when a source is
    newer (-W pretends so without touching the file)."""
    what_if = ["-W", source] if source else []
    done = make("-q", *what_if, str(built), f"ORT_OPS_DIR={built.parent}",
                f"ORT_OPS_CMAKE={built.parent / 'cmake'}")
    assert done.returncode == (1 if source else 0), done.stdout + done.stderr


def test_sessions_look_for_the_library_where_make_writes_it():
    """The sessions' default library is the file `make ort-ops` writes (Makefile ORT_OPS_DIR)."""
    found = re.search(r"^ORT_OPS_DIR\s*\?=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "ORT_OPS_DIR default not found in the Makefile"
    assert default_library() == ROOT / found.group(1) / LIB
