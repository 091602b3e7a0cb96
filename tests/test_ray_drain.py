"""SIGTERM to `irpe serve --ray` drains to the single-server standard (issue 50, defect 2),
with real Ray, a real process, a real signal and keep-alive clients: readiness answers 503
over HTTP during the grace, answers in the drain carry `Connection: close`, and no request sent
before its client was told (a `Connection: close` or a 503) goes without an answer or with a
connection error; the command exits 0 with every process it started gone."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import List

import httpx
import pytest
import yaml

pytest.importorskip("ray.serve")

from benchmarks.ray_serve import free_port  # noqa: E402 (after the importorskip)
from tests.helpers import ROOT, shape_png  # noqa: E402
from tests.test_ray_signals import alive, descendants  # noqa: E402

pytestmark = pytest.mark.timeout(240)
CLIENTS = 32
GRACE_S = 3.0


@dataclass
class Tally:
    """What the clients saw: per request (told before sending?, status or error)."""

    ready_503: int = 0
    closing: int = 0
    bad: List[str] = field(default_factory=list)  # errors of requests sent before told
    after: int = 0  # requests sent after their client was told (anything goes)
    ok: int = 0


async def client(url: str, body: bytes, tally: Tally, done: asyncio.Event, ready: bool) -> None:
    """One keep-alive client: classify (or readiness) in a loop until ``done``."""
    told = False
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while not done.is_set():
            try:
                if ready:
                    answer = await http.get("/v2/health/ready")
                else:
                    answer = await http.post("/v1/classify", content=body,
                                             headers={"Content-Type": "image/png"})
            except httpx.HTTPError as exc:
                if told:
                    tally.after += 1
                    await asyncio.sleep(0.05)
                else:
                    tally.bad.append(type(exc).__name__)
                continue
            if told:
                tally.after += 1
            elif answer.status_code == 200:
                tally.ok += 1
            closing = answer.headers.get("connection", "").lower() == "close"
            tally.closing += closing
            tally.ready_503 += ready and answer.status_code == 503
            told = told or closing or answer.status_code == 503
            if ready:
                await asyncio.sleep(0.1)


async def load(url: str, proc: subprocess.Popen, seen: set) -> Tally:
    tally, done, body = Tally(), asyncio.Event(), shape_png(1)
    tasks = [asyncio.create_task(client(url, body, tally, done, ready=i == 0))
             for i in range(CLIENTS + 1)]
    await asyncio.sleep(3)
    seen |= descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    while proc.poll() is None:
        await asyncio.sleep(0.1)
    done.set()
    await asyncio.gather(*tasks)
    return tally


def test_sigterm_drains_ray_replicas_like_irpe_serve(tmp_path):
    repo = tmp_path / "repo.yaml"
    demo = ROOT / "irpe" / "demo" / "deit_shapes_irpe.safetensors"
    repo.write_text(yaml.safe_dump({"models": [{"name": "cls", "path": str(demo)}],
                                    "threads": 1, "drain_grace_s": GRACE_S}))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IRPE_SERVE", "RAY_"))}
    log = tmp_path / "stderr.txt"  # a file, not a pipe: Ray's log lines never block the command
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", str(repo), "--ray",
                                 "--port", str(port)], cwd=ROOT, env=env, stderr=err)
    seen: set = set()
    try:
        deadline = time.monotonic() + 180
        while '"message": "serving"' not in log.read_text():
            assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, "not serving within 180 s"
            time.sleep(0.2)
        started = time.monotonic()
        tally = asyncio.run(load(f"http://127.0.0.1:{port}", proc, seen))
        took = time.monotonic() - started
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(tally, f"{took:.1f} s")
    assert proc.returncode == 0
    assert tally.ok > 0 and tally.ready_503 > 0 and tally.closing > 0, tally
    assert tally.bad == [], tally
    deadline = time.monotonic() + 10
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(seen)
