"""SIGTERM to ``irpe serve --ray`` under keep-alive clients, each ingress: what the clients saw.

``python -m benchmarks.ray_drain [--ingress proxy haproxy] [--tries 3] [--private-network]``
(needs ``pip install 'irpe-deploy[ray]'``; the HAProxy ingress also ``haproxy``):

Each try starts ``irpe serve --ray`` (a local Ray, the demo classifier, ``drain_grace_s``
``--grace-s``) with ``ray: ingress: X``, runs ``--clients`` keep-alive clients classifying one
PNG in a loop and one polling readiness, sends SIGTERM after ``--load-s`` seconds and keeps the
clients going until the command has exited. A client is *told* once it got a response with
``Connection: close`` or a 503; from then on anything goes (the server is stopping). Counted:
answers before told (200s), readiness 503s seen over HTTP, ``Connection: close`` answers, the
**bad** requests (sent before their client was told, ending with no response or a connection
error: the drain's goal is 0), the command's exit status and the processes it started that
are still alive 10 s after it exited.

``--private-network`` runs everything in a new network namespace (``unshare --net``, root or
user namespaces needed) whose only interface is loopback: Ray's HAProxy configuration binds
its stats and metrics ports (8404, 9101) on all interfaces, which there means loopback only.
The tests (tests/test_ray_drain.py) run one try of each ingress this way.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Set

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "irpe" / "demo" / "deit_shapes_irpe.safetensors"

__all__ = ["Tally", "alive", "descendants", "drain_try", "main"]


@dataclass
class Tally:
    """What the clients of one try saw."""

    ok: int = 0  # 200s before told
    ready_503: int = 0  # readiness answers 503
    closing: int = 0  # answers with Connection: close
    bad: Dict[str, int] = field(default_factory=dict)  # sent before told: error -> count
    after: int = 0  # requests sent after their client was told (anything goes)


def _children() -> Dict[int, int]:
    """pid -> parent pid of every process now."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            table[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid: int) -> Set[int]:
    """The processes below ``pid`` now (children, theirs, ...)."""
    table, found, frontier = _children(), set(), {pid}
    while frontier:
        frontier = {child for child, parent in table.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: Set[int]) -> Set[int]:
    """Those of ``pids`` still running (a zombie counts as gone)."""
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


async def _client(url: str, body: bytes, tally: Tally, done: asyncio.Event,
                  ready: bool) -> None:
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
                else:
                    name = type(exc).__name__
                    tally.bad[name] = tally.bad.get(name, 0) + 1
                await asyncio.sleep(0.05)  # a server gone: no busy loop of connects
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


async def _load(url: str, proc: subprocess.Popen, clients: int, load_s: float,
                seen: Set[int]) -> Tally:
    """The clients for ``load_s``, SIGTERM, the clients until the command has exited."""
    from benchmarks.serve_load import png

    tally, done, body = Tally(), asyncio.Event(), png(64, 1)
    tasks = [asyncio.create_task(_client(url, body, tally, done, ready=i == 0))
             for i in range(clients + 1)]
    await asyncio.sleep(load_s)
    seen |= descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    while proc.poll() is None:
        await asyncio.sleep(0.1)
    done.set()
    await asyncio.gather(*tasks)
    return tally


def _wait_serving(proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while '"message": "serving"' not in log.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"irpe serve --ray exited {proc.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"irpe serve --ray not serving within {timeout_s:g} s")
        time.sleep(0.2)


def drain_try(ingress: str, clients: int = 32, grace_s: float = 3.0, load_s: float = 3.0,
              folder: Optional[Path] = None) -> Dict[str, Any]:
    """One try (module docstring); the figures as a dict."""
    from benchmarks.ray_serve import free_port

    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        repo, log = Path(tmp) / "repo.yaml", Path(tmp) / "stderr.txt"
        repo.write_text(yaml.safe_dump({"models": [{"name": "cls", "path": str(DEMO)}],
                                        "threads": 1, "drain_grace_s": grace_s,
                                        "ray": {"ingress": ingress}}))
        port = free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("IRPE_SERVE", "RAY_"))}
        with log.open("w") as err:  # a file, not a pipe: Ray's log lines never block it
            proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", str(repo), "--ray",
                                     "--port", str(port)], cwd=ROOT, env=env, stdout=err,
                                    stderr=err)
        seen: Set[int] = set()
        try:
            _wait_serving(proc, log, 180)
            started = time.monotonic()
            tally = asyncio.run(_load(f"http://127.0.0.1:{port}", proc, clients, load_s, seen))
            stop_s = time.monotonic() - started - load_s
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        deadline = time.monotonic() + 10
        while alive(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        return {"ingress": ingress, **asdict(tally), "exit": proc.returncode,
                "stop_s": round(stop_s, 2), "left_alive": len(alive(seen))}


def _private(argv: Sequence[str]) -> int:
    """This command again, in a new network namespace with loopback up."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not Path(ip).exists():
        raise SystemExit("--private-network needs unshare (util-linux) and ip (iproute2)")
    inner = [a for a in argv if a != "--private-network"]
    command = [unshare, "--net", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh",
               sys.executable, "-m", "benchmarks.ray_drain", *inner]
    return subprocess.run(command, cwd=ROOT).returncode


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ray_drain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ingress", nargs="+", choices=("proxy", "haproxy"),
                   default=["proxy", "haproxy"])
    p.add_argument("--tries", type=int, default=3, help="tries per ingress")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--grace-s", type=float, default=3.0, help="the server's drain_grace_s")
    p.add_argument("--load-s", type=float, default=3.0, help="load before the SIGTERM")
    p.add_argument("--private-network", action="store_true",
                   help="run in a new network namespace (loopback only)")
    p.add_argument("--json", action="store_true", help="one JSON line per try, no table")
    p.add_argument("--out", type=Path, help="write the report (Markdown) here too")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.private_network:
        return _private(argv)
    lines = [f"# SIGTERM to irpe serve --ray, {args.clients} keep-alive clients + 1 readiness "
             f"poller, drain_grace_s {args.grace_s:g}, SIGTERM after {args.load_s:g} s", "",
             "| ingress | try | 200 before told | readiness 503s | Connection: close | "
             "bad (goal 0) | after told | exit | stop s | processes left |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for ingress in args.ingress:
        for t in range(args.tries):
            row = drain_try(ingress, args.clients, args.grace_s, args.load_s)
            if args.json:
                print(json.dumps(row), flush=True)
                continue
            lines.append(f"| {ingress} | {t + 1} | {row['ok']} | {row['ready_503']} | "
                         f"{row['closing']} | {sum(row['bad'].values())} {row['bad'] or ''} | "
                         f"{row['after']} | {row['exit']} | {row['stop_s']} | "
                         f"{row['left_alive']} |")
            print(lines[-1], flush=True)
    if not args.json:
        from benchmarks.ray_serve import finish_report
        finish_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
