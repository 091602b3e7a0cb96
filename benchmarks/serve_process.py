"""Benchmark-side server helpers: `irpe serve` as a child process on 127.0.0.1.

The child binds port 0 itself and announces its URL with the "serving" log line, written once
the socket accepts connections, so there is no port chosen here and bound later (a race).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, List, Optional, Sequence, Tuple

__all__ = ["start_serve", "stop", "wait_ready"]

ROOT = Path(__file__).resolve().parents[1]


def start_serve(args: Sequence[str], log: Optional[Path] = None, env: Optional[dict] = None,
                preexec_fn: Optional[Callable[[], None]] = None,
                root: Optional[Path] = None) -> Tuple[subprocess.Popen, str]:
    """`python -m irpe serve ARGS --port 0 --log-level info` from the checkout ``root`` (default
    this one); returns (process, URL) once it logs "serving". Later log lines go to ``log`` (or
    are discarded) by a drain thread. ``root`` leads PYTHONPATH; the entries already there stay
    after it (`make gpu-check` puts the carried serving-stack wheels there)."""
    cmd = [sys.executable, "-m", "irpe", "serve", *args, "--port", "0", "--log-level", "info"]
    root = Path(root or ROOT)
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env, cwd=root, preexec_fn=preexec_fn)
    seen: List[str] = []
    for line in proc.stderr:
        seen.append(line)
        if _message(line) == "serving":
            threading.Thread(target=_drain, args=(proc.stderr, log, seen), daemon=True).start()
            return proc, json.loads(line)["url"]
    code = proc.wait()
    raise RuntimeError(f"irpe serve exited ({code}) before serving: {''.join(seen)[-2000:]}")


def _message(line: str) -> Optional[str]:
    try:
        return json.loads(line).get("message")
    except (ValueError, AttributeError):
        return None


def _drain(stream: IO[str], log: Optional[Path], seen: List[str]) -> None:
    """Keep reading the child's stderr (a full pipe would block it), into ``log`` if given."""
    if log is None:
        for _ in stream:
            pass
        return
    with open(log, "w") as out:
        out.writelines(seen)
        for line in stream:
            out.write(line)


def wait_ready(url: str, timeout_s: float = 180.0) -> None:
    """Poll GET /v2/health/ready until 200; connection errors mean "not yet" until the
    deadline, then TimeoutError naming what was awaited."""
    import httpx
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"GET {url}/v2/health/ready == 200: not reached within {timeout_s:g} s")


def stop(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGTERM (the server drains), SIGKILL after ``timeout_s``."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
