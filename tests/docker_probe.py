"""Probe the serving image as a user would (scripts/docker-test.sh runs this after the build):
docs/docker.md's hardened `docker run` on 127.0.0.1, every answer compared with `irpe serve` run
outside the container on the same model files, then `docker stop` draining in-flight requests.

    python -m tests.docker_probe --image irpe-deploy:cpu [--docker /usr/bin/docker]

Prints one line per check and exits 1 on the first failed check (a test aid, not product code).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import httpx
import numpy as np

from tests.docker_requests import CHECKS, drain_request, error_checks, infer_v2
from tests.helpers import ROOT, metric, start_cli, wait_ready

START_PERIOD_S = 180.0   # the Dockerfile's HEALTHCHECK --start-period
STOP_TIMEOUT_S = 10      # docker stop's default; the image drains within 2 + 6 s (Dockerfile)
HOLD_S = 1.0             # the held drain request sends its body's rest this long after the stop
THREADS = "2"            # same ONNX Runtime pool size in and out of the container
REPOSITORY = """\
models:
  - name: deit_shapes_irpe
    path: onnx/{deit}
    backend: onnxruntime
    max_batch_size: 8
  - name: detr_shapes_irpe
    path: onnx/{detr}
    backend: onnxruntime
    max_batch_size: 4
"""


class ProbeError(AssertionError):
    """A check that failed: its message is the report line."""


def check(ok: bool, what: str) -> None:
    """Print ``ok <what>`` or raise ProbeError."""
    if not ok:
        raise ProbeError(what)
    print(f"ok   {what}", flush=True)


class Docker:
    """The docker client, run as a subprocess (the probe uses the CLI a user types)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def __call__(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        """stdout of ``docker ARGS``; a non-zero exit raises with stderr unless check=False."""
        done = subprocess.run([self.binary, *args], capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise ProbeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout.strip()

    def logs(self, cid: str, tail: str = "all") -> str:
        """The container's stdout + stderr (the server logs to stderr)."""
        done = subprocess.run([self.binary, "logs", "--tail", tail, cid], capture_output=True,
                              text=True)
        return done.stdout + done.stderr

    def state(self, cid: str, field: str) -> str:
        """One field of the container's state (docker inspect)."""
        return self("inspect", "--format", "{{" + field + "}}", cid, check=False)


def model_repository(docker: Docker, image: str, folder: Path) -> Path:
    """The image's baked demo ONNX files copied out, plus a models.yaml naming them: the model
    repository both servers load (mounted read-only into the container)."""
    cid = docker("create", image)
    try:
        docker("cp", f"{cid}:/var/cache/irpe/onnx", str(folder / "onnx"))
    finally:
        docker("rm", "-v", cid)   # -v: the VOLUME the image declares
    files = {p.name.split("-")[0]: p.name for p in (folder / "onnx").glob("*.onnx")}
    check(set(files) == {"deit_shapes_irpe", "detr_shapes_irpe"},
          f"image bakes both demo ONNX files into $IRPE_CACHE: {sorted(files.values())}")
    repo = folder / "models.yaml"
    repo.write_text(REPOSITORY.format(deit=files["deit_shapes_irpe"],
                                      detr=files["detr_shapes_irpe"]))
    for path in [folder, *folder.rglob("*")]:   # readable by the image's uid 10001
        path.chmod(0o755 if path.is_dir() else 0o644)
    return repo


def run_container(docker: Docker, image: str, repo: Path, name: str) -> Tuple[str, str, float]:
    """docs/docker.md's hardened run: published on 127.0.0.1 only, read-only root filesystem,
    cache volume, model repository mounted read-only; (container id, URL, start time)."""
    docker("volume", "rm", "-f", f"{name}-cache", check=False)
    started = time.monotonic()
    cid = docker("run", "-d", "--name", name, "-p", "127.0.0.1::8000", "--read-only",
                 "--tmpfs", "/tmp", "-v", f"{name}-cache:/var/cache/irpe",
                 "-v", f"{repo.parent}:/models:ro",
                 "-e", "IRPE_SERVE_REPOSITORY=/models/models.yaml",
                 "-e", f"IRPE_SERVE_THREADS={THREADS}", image)
    port = docker("port", cid, "8000/tcp").splitlines()[0].rsplit(":", 1)[1]
    return cid, f"http://127.0.0.1:{port}", started


def wait_healthy(docker: Docker, cid: str, started: float) -> float:
    """Seconds from `docker run` until docker inspect says healthy (the HEALTHCHECK's verdict)."""
    while time.monotonic() - started < START_PERIOD_S:
        status = docker.state(cid, ".State.Health.Status")
        if status == "healthy":
            return time.monotonic() - started
        if docker.state(cid, ".State.Running") != "true":
            raise ProbeError("container exited before healthy:\n" + docker.logs(cid, "30"))
        time.sleep(0.5)
    raise ProbeError(f"not healthy within the start period ({START_PERIOD_S:.0f} s): "
                     + docker.logs(cid, "20"))


def check_hardening(docker: Docker, cid: str) -> None:
    """uid 10001, read-only root filesystem, the repository mount and its variable."""
    check(docker("exec", cid, "id", "-u") == "10001", "runs as uid 10001 (docker exec id -u)")
    check(docker.state(cid, ".HostConfig.ReadonlyRootfs") == "true", "root filesystem read-only")
    denied = subprocess.run([docker.binary, "exec", cid, "touch", "/opt/venv/x"],
                            capture_output=True, text=True)
    check(denied.returncode != 0 and "Read-only file system" in denied.stderr,
          "a write outside the volumes fails: " + denied.stderr.strip())
    mounts = json.loads(docker("inspect", "--format", "{{json .Mounts}}", cid))
    check({m["Destination"] for m in mounts} >= {"/models", "/var/cache/irpe"},
          "volumes: " + ", ".join(f"{m['Destination']} ({m['Type']}, rw={m['RW']})"
                                  for m in mounts))


_KERNEL_CHECK = """
import os, torch
from irpe.attention import rpe_attention, unfused_attention
from irpe.fused.cpu_library import cpu_library
from irpe.rpe import build_rpe, get_rpe_config
lib = cpu_library()
mods = build_rpe(get_rpe_config(1.9, "product", "ctx", True, 1, "qkv"), 16, 2,
                 initializer=lambda p: torch.nn.init.normal_(p, std=0.5))
q, k, v = torch.randn(3, 2, 2, 10, 16).unbind(0)
with torch.inference_mode():
    err = (rpe_attention(q, k, v, 0.25, *mods, 3, 3)
           - unfused_attention(q, k, v, 0.25, *mods, 3, 3)).abs().max().item()
print(lib.path if lib else "none", lib.simd().decode() if lib else "-",
      os.path.isfile(os.environ["IRPE_ORT_OPS_LIBRARY"]), err)
"""


def check_cpu_kernel(docker: Docker, cid: str) -> None:
    """The native iRPE attention kernel (IRPE_CPU_ATTENTION_LIBRARY) is in the image exactly
    when the ORT library is (one build makes both), and iRPE attention on the torch path agrees
    with the unfused path either way (the kernel, or the SDPA path without it)."""
    path, simd, ort_lib, err = docker("exec", cid, "python", "-c", _KERNEL_CHECK).split()
    kernel = path == "/opt/irpe-deploy/plugins/libirpe_cpu_attention.so"
    check(kernel == (ort_lib == "True") and (kernel or path == "none") and float(err) < 1e-5,
          f"native iRPE attention kernel: {path} ({simd}; ORT library present: {ort_lib}); "
          f"torch iRPE attention vs unfused max diff {err}")


def image_has_ov_library(docker: Docker, cid: str) -> bool:
    """Whether the image holds the iRPE OpenVINO library where its IRPE_OV_OPS_LIBRARY says
    (built where the build stage had cmake and g++; else OpenVINO runs the conversions)."""
    found = docker("exec", cid, "python", "-c", "import os; print(os.path.isfile("
                   "os.environ['IRPE_OV_OPS_LIBRARY']))").strip() == "True"
    check(True, f"iRPE OpenVINO library in the image: {'yes' if found else 'no (conversions)'}")
    return found


def compare(host: str, box: str) -> None:
    """Every request of tests/docker_requests.CHECKS answered equally by both servers."""
    with httpx.Client(timeout=60) as client:
        for what, send in CHECKS:
            a, b = send(client, host), send(client, box)
            check(a == b, f"{what}: container == host ({str(b)[:90]}...)")
        for what, send in error_checks():
            a, b = send(client, host), send(client, box)
            check(a == b and 400 <= b[0] < 500 and "error" in b[1],
                  f"bad input, {what}: {b[0]} {json.dumps(b[1])[:80]}")
            ok = CHECKS[0][1](client, box)
            check(ok == CHECKS[0][1](client, host), "  ... and the next good request is served")
    a, b = infer_v2(host), infer_v2(box)
    check(np.array_equal(a, b),
          f"v2 infer through tritonclient (binary + classification): {b.tolist()}")


def drain(docker: Docker, cid: str, url: str, host: str, work_s: float = 2.5) -> Dict[str, float]:
    """`docker stop` with slow requests in flight (about ``work_s`` of queued work, sized from
    one timed request): every one answered like the host's answer, exit code 0, within the
    stop timeout."""
    with httpx.Client(timeout=120) as client:
        expected = drain_request(client, host)
        t = time.monotonic()
        check(drain_request(client, url) == expected, "drain request: container == host")
        one = time.monotonic() - t
    # at most 7 requests of 8 images: the model's queue holds 64 images, and more would be
    # refused with 503 (queue full) instead of drained, depending on the machine's speed
    requests = max(3, min(7, round(work_s / one)))
    results: List[Optional[Tuple[float, object]]] = [None] * requests
    held = threading.Event()  # request 0's body ends only after the stop began: an overlap by
    # construction, however fast the others run (they may all be done before the stop)

    def send(i: int) -> None:
        with httpx.Client(timeout=120) as client:
            try:
                answer = drain_request(client, url, held if i == 0 else None)
            except httpx.HTTPError as exc:
                answer = repr(exc)
        results[i] = (time.monotonic(), answer)   # when it finished
    threads = [threading.Thread(target=send, args=(i,)) for i in range(requests)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while True:   # every request accepted: in flight (the gauge, less /metrics itself) or done
        done = sum(r is not None for r in results)   # read first: a lower bound at the poll
        if metric(url, "irpe_http_requests_in_flight") - 1 + done >= requests:
            break
        if time.monotonic() > deadline:
            raise ProbeError("the drain requests were never all accepted")
        time.sleep(0.02)
    stop_at = time.monotonic()
    release = threading.Timer(HOLD_S, held.set)  # the body's rest, once SIGTERM has landed
    release.start()
    docker("stop", cid, timeout=STOP_TIMEOUT_S + 30)
    release.join()
    stopped = time.monotonic() - stop_at
    for t in threads:
        t.join(120)
    after = sum(1 for r in results if r and r[0] > stop_at)
    lost = [r[1] for r in results if not r or r[1] != expected]
    check(not lost, f"docker stop with {requests} detect requests in flight ({one:.2f} s each "
          f"alone): all answered, equal to the host's; {after} finished after the stop began"
          + (f"; lost: {lost[:2]}" if lost else ""))
    check(after >= 1, "the stop overlapped requests (at least one finished after it)")
    code = docker.state(cid, ".State.ExitCode")
    check(code == "0" and stopped < STOP_TIMEOUT_S,
          f"container exit code {code}, stopped in {stopped:.1f} s "
          f"(stop timeout {STOP_TIMEOUT_S} s)")
    check('"draining"' in docker.logs(cid), "its log says draining")
    return {"stop_s": round(stopped, 1), "drain_requests": requests,
            "finished_after_stop": after}


def demo_prepare(docker: Docker, image: str, work: Path) -> None:
    """The image's default (demo) models: read-only, from the baked cache; then with an empty
    cache folder of the host (owned by uid 10001) as the cache, so the export path (torch ->
    ONNX at start, what a .safetensors repository does) is shown to work in the lean image."""
    empty = work / "empty-cache"
    empty.mkdir()
    os.chown(empty, 10001, 10001)
    for extra, what in (([], "from the baked cache"),
                        (["-v", f"{empty}:/var/cache/irpe"],
                         "exported at start into an empty cache")):
        t = time.monotonic()
        out = docker("run", "--rm", "--read-only", "--tmpfs", "/tmp", *extra, image,
                     "irpe", "serve", "--prepare", "--log-level", "warning")
        rows = [line.split() for line in out.splitlines()[1:]]
        check(len(rows) == 2 and all(r[2] == "openvino" and r[3] == "ready" and
                                     r[4].startswith("/var/cache/irpe/onnx/") for r in rows),
              f"demo models (the image's CMD) on OpenVINO, the CPU default, read-only, {what} in "
              f"{time.monotonic() - t:.0f} s: "
              + "; ".join(f"{r[0]} {r[3]} {r[4].rsplit('/', 1)[1]}" for r in rows))
    check(len(list((empty / "onnx").glob("*.onnx"))) == 2, "  ... the two exported files are there")


def main(argv: Optional[List[str]] = None) -> int:
    """Run every check; 0 when all pass."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True)
    p.add_argument("--docker", default=os.environ.get("DOCKER", "docker"))
    args = p.parse_args(argv)
    docker = Docker(args.docker)
    work = Path(tempfile.mkdtemp(prefix="docker-probe-", dir=ROOT / "build"))
    name = f"irpe-probe-{os.getpid()}"
    host_proc = None
    try:
        repo = model_repository(docker, args.image, work)
        cid, url, started = run_container(docker, args.image, repo, name)
        ov_lib = image_has_ov_library(docker, cid)
        # the reference server runs the iRPE nodes as the image does: answers compare exactly
        env = dict(os.environ, IRPE_ORT_CUSTOM_OPS="off", IRPE_OV_OPS="on" if ov_lib else "off",
                   IRPE_SERVE_THREADS=THREADS, IRPE_CACHE=str(work / "cache"))
        host_proc, host, _ = start_cli(repo, env)
        # keep reading its log, so a full pipe never blocks the reference server
        threading.Thread(target=host_proc.stderr.read, daemon=True).start()
        healthy = wait_healthy(docker, cid, started)
        check(True, f"healthy (docker inspect) {healthy:.1f} s after docker run "
                    f"(start period {START_PERIOD_S:.0f} s)")
        wait_ready(host, 120)
        check_hardening(docker, cid)
        check_cpu_kernel(docker, cid)
        compare(host, url)
        figures = drain(docker, cid, url, host)
        demo_prepare(docker, args.image, work)
        print(json.dumps({"healthy_s": round(healthy, 1), **figures}), flush=True)
        return 0
    except ProbeError as exc:
        print(f"FAIL {exc}", flush=True)
        print(f"container log (last lines):\n{docker.logs(name, '30')}", flush=True)
        return 1
    finally:
        if host_proc is not None:
            host_proc.terminate()
            host_proc.wait(30)
        docker("rm", "-f", "-v", name, check=False)
        docker("volume", "rm", "-f", f"{name}-cache", check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
