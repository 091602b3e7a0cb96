"""Engine builds in a child process, for builds that load plugin libraries.

Once an ONNX node maps to a plugin, TensorRT-RTX's parser ``dlopen``s ``libtensorrt_rtx.so``, a
name its wheel does not ship (only ``.so.1``), and the process aborts. The child gets a private
folder on ``LD_LIBRARY_PATH`` with ``libX.so -> libX.so.N`` links for the TensorRT wheels'
libraries, and whatever happens in it (an abort included) reaches the caller as one exception.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List

from irpe.runtime.tensorrt.common import EngineBuildError, TensorRTUnavailable, wheel_library_dirs

__all__ = ["build_in_subprocess", "child_main", "link_unversioned"]

ROOT = Path(__file__).resolve().parents[3]  # the checkout: the child imports irpe from it
CHILD = "irpe.runtime.tensorrt.build"  # the module whose __main__ builds in the child


def _errors() -> Dict[str, type]:
    """Exception types a child's error is re-raised as (the first one in its MRO)."""
    kinds = (EngineBuildError, TensorRTUnavailable, FileNotFoundError, ValueError, OSError)
    return {c.__name__: c for c in kinds}


def link_unversioned(target: Path, lib_dirs: List[Path]) -> List[str]:
    """Link ``libX.so`` -> ``libX.so.N`` in ``target`` where a wheel ships only the latter."""
    made = []
    for folder in lib_dirs:
        for lib in sorted(folder.glob("lib*.so.*")):
            plain = lib.name.split(".so.")[0] + ".so"
            if not (folder / plain).exists() and not (target / plain).exists():
                (target / plain).symlink_to(lib)
                made.append(plain)
    return made


def _child_env(link_dir: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(link_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _died(rc: int, stderr: str) -> str:
    how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
    tail = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
    return f"the TensorRT build process died ({how}); last output: {' | '.join(tail) or 'none'}"


def build_in_subprocess(kwargs: Dict) -> Dict:
    """Run ``build_engine(**kwargs, isolate=False)`` in a child; return its sidecar dict.

    The child's log is copied to stderr. Errors are re-raised here with their message.
    """
    for path in kwargs.get("plugins", ()):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"plugin library not found: {path}")
    with tempfile.TemporaryDirectory(prefix="irpe-trt-") as tmp:
        link_dir, result = Path(tmp) / "lib", Path(tmp) / "result.json"
        link_dir.mkdir()
        link_unversioned(link_dir, wheel_library_dirs())
        args = {**kwargs, "onnx_path": os.fspath(kwargs["onnx_path"]),
                "engine_path": os.fspath(kwargs["engine_path"])}
        proc = subprocess.run([sys.executable, "-m", CHILD, json.dumps(args),
                               str(result)], env=_child_env(link_dir), capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        sys.stderr.write(proc.stderr)
        if not result.is_file():
            raise EngineBuildError(_died(proc.returncode, proc.stderr))
        answer = json.loads(result.read_text())
    if not answer["ok"]:
        kinds = _errors()
        kind = next((kinds[n] for n in answer["types"] if n in kinds), EngineBuildError)
        raise kind(answer["message"])
    return answer["sidecar"]


def child_main(build: Callable[..., Dict], argv: List[str]) -> int:
    """The child's side: ``build(**kwargs)``, its sidecar or its error written as JSON."""
    kwargs, result = json.loads(argv[0]), Path(argv[1])
    try:
        answer = {"ok": True, "sidecar": build(**kwargs)}
    except Exception as exc:  # reported to the parent, which re-raises it
        answer = {"ok": False, "types": [c.__name__ for c in type(exc).__mro__],
                  "message": str(exc)}
    result.write_text(json.dumps(answer))
    return 0 if answer["ok"] else 1
