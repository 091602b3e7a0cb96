"""Triton's own load generator, perf_analyzer, against a real `irpe serve` with its default
input (`--input-data random`: random FP32 bytes, NaN and infinity among them) and no data
option (issue 51, item 3): binary and JSON tensors, batch 4, concurrency and request-rate
modes, each with 0 errors (perf_analyzer exits non-zero on any failed request).

The perf-analyzer wheel needs glibc 2.38; tools/perf_analyzer.py runs it here through a Debian
13 loader and libraries (`make perf-analyzer` prepares it; CI does, so there it never skips).
Only the measurement is shortened (200 requests, no stability windows): what is tested is that
every request of its default load is answered."""
from __future__ import annotations

import os
import subprocess
from urllib.parse import urlsplit

import pytest

from serve.config import ServeSettings
from tests.helpers import running_server
from tools.perf_analyzer import command

PREFIX = command()
if PREFIX is None and os.environ.get("CI") != "true":
    pytest.skip("perf_analyzer not prepared (make perf-analyzer)", allow_module_level=True)

# a fixed number of requests instead of windows until stable: no stability verdict to miss on a
# busy machine (perf_analyzer aborts when 3 windows differ by more than -s percent)
SHORT = ["--request-count", "200"]


@pytest.fixture(scope="module")
def server():
    """`irpe serve`'s demo classifier on the runtime it picks (OpenVINO where installed)."""
    from serve.demo import demo_models
    settings = ServeSettings(threads=1, log_level="warning", models=demo_models()[:1])
    with running_server(settings) as url:
        yield urlsplit(url).netloc


@pytest.mark.parametrize("mode", [[], ["--input-tensor-format", "json",
                                       "--output-tensor-format", "json"],
                                  ["-b", "4"], ["--concurrency-range", "4"],
                                  ["--request-rate-range", "40"]],
                         ids=["defaults", "json", "batch-4", "concurrency-4", "rate-40"])
def test_perf_analyzer_with_its_default_input_has_no_error(server, mode):
    assert PREFIX is not None, "CI prepares perf_analyzer (make perf-analyzer)"
    done = subprocess.run(PREFIX + ["-m", "deit_shapes_irpe", "-u", server, *SHORT, *mode],
                          capture_output=True, text=True, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Throughput:" in output and "error" not in output.lower(), output[-3000:]
