"""SIGTERM to `irpe serve --ray` drains to the single-server standard on each ingress (issue
50, defect 2), with real Ray, a real process, a real signal and 32 keep-alive clients
(benchmarks/ray_drain.py, one try per ingress): readiness answers 503 over HTTP during the
grace, answers in the drain carry `Connection: close`, no request sent before its client was
told (a `Connection: close` or a 503) goes without an answer or with a connection error, the
command exits 0 and every process it started is gone within 10 s.

Each try runs in a private network namespace (`unshare --net`, loopback only): Ray's HAProxy
binds its stats and metrics ports on all interfaces, which there are loopback alone."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("ray.serve")

from tests.helpers import ROOT  # noqa: E402 (after the importorskip)

pytestmark = pytest.mark.timeout(300)


def _private_network_usable() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.parametrize("ingress", ["proxy", "haproxy"])
def test_sigterm_drains_every_ingress_like_irpe_serve(ingress):
    ci = bool(os.environ.get("CI"))  # CI installs haproxy and runs as root: never skip there
    if not ci and ingress == "haproxy" and shutil.which("haproxy", path="/usr/sbin:" +
                                                        os.environ.get("PATH", "")) is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    if not ci and not _private_network_usable():
        pytest.skip("no new network namespace here (unshare --net needs root or userns)")
    done = subprocess.run([sys.executable, "-m", "benchmarks.ray_drain", "--ingress", ingress,
                           "--tries", "1", "--json", "--private-network"], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    print(row)
    assert row["exit"] == 0 and row["left_alive"] == 0, row
    assert row["ok"] > 0 and row["ready_503"] > 0 and row["closing"] > 0, row
    assert row["bad"] == {}, row
