"""`make gpu-check` on CPU (issue 27): the dry run prints the plan and runs what needs no GPU,
with the serving stack blocked as on the bare GPU image, so tests/gpu must collect with 0
errors; steps die at their timeout; the budget guard skips; reports merge over calls."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402
from gpu_check_report import junit_summary, write_report  # noqa: E402
from gpu_check_steps import CALLS, PHASES, Step, plan  # noqa: E402

BLOCKER = str(ROOT / "tests" / "blocked_imports")  # its sitecustomize blocks $IRPE_TEST_BLOCKED
SERVING_STACK = "fastapi,pydantic,pydantic_core,pydantic_settings,starlette,uvicorn"


def test_make_gpu_check_dry_run_collects_tests_gpu_without_the_serving_stack(tmp_path):
    env = dict(os.environ, PYTHONPATH=BLOCKER, IRPE_TEST_BLOCKED=SERVING_STACK)
    done = subprocess.run(["make", "--no-print-directory", "gpu-check", "--dry-run",
                           f"GPU_CHECK_PY={sys.executable}", f"GPU_CHECK_OUT={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for step in plan(tmp_path):  # the whole plan is printed, GPU steps included
        assert step.key in out
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["env"]["serving_stack"] is False  # the block reached the script's process
    collect = doc["steps"]["env/collect"]
    assert collect["status"] == "passed" and collect["collect_errors"] == 0, collect["tail"]
    assert collect["collected"] > 100
    assert doc["steps"]["env/variants"]["status"] == "passed"
    assert not any(k.startswith(("tests/", "probes/", "bench/")) for k in doc["steps"])
    assert doc["runs"][-1]["dry_run"] is True
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("# gpu-check: no CUDA device") and "| env/collect | passed |" in md


def test_calls_cover_every_phase_and_fit_nine_minutes():
    assert {p for phases in CALLS.values() for p in phases} == set(PHASES)
    assert gpu_check.parse_args([]).budget <= 9 * 60


def test_step_is_killed_at_its_timeout():
    sleeper = Step("tests", "sleep", "sleeps", (sys.executable, "-c",
                                                "import time; print('up', flush=True); "
                                                "time.sleep(60)"), 60)
    result = gpu_check.run_step(sleeper, 2.0, dict(os.environ))
    assert result["status"] == "timeout" and result["seconds"] < 30
    assert "up" in result["tail"]


def test_budget_guard_and_bad_phase(tmp_path, capsys):
    assert gpu_check.main(["--phases", "env,nope"]) == 2
    assert "unknown phase nope" in capsys.readouterr().err
    assert gpu_check.main(["--phases", "env", "--dry-run", "--budget", "1",
                           "--out", str(tmp_path)]) == 0
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["env/collect"]["status"] == "skipped"
    assert steps["env/collect"]["reason"].startswith("budget")


def test_report_merges_calls_and_names_failures(tmp_path):
    facts = {"device_slug": "gpu-x", "device": "X", "date": "d", "load_avg": [0, 0, 0],
             "versions": {"torch": "2.11"}, "driver": "580"}
    write_report(tmp_path, facts, {"tests/a": {"status": "passed", "seconds": 1}}, ["tests"],
                 False, 1.0)
    bad = {"status": "failed", "tail": "boom", "tests": {
        "passed": 1, "failed": 1, "skipped": 0, "total": 2, "skips": {},
        "failures": ["t::test_variant_smoke[k-fp16]: boom"],
        "cases": {"test_variant_smoke[k-fp16]": "failed", "test_variant_smoke[k-bf16]": "passed"}}}
    write_report(tmp_path, facts, {"probes/triton-variants": bad}, ["probes"], False, 2.0)
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(doc["steps"]) == {"tests/a", "probes/triton-variants"} and len(doc["runs"]) == 2
    md = (tmp_path / "gpu_check.md").read_text()
    assert "driver 580" in md and "torch 2.11" in md and "`k-fp16` failed" in md


def test_junit_summary(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="a" name="ok"/>'
                   '<testcase classname="a" name="bad"><failure message="x differs">t'
                   '</failure></testcase><testcase classname="a" name="s"><skipped '
                   'message="no CUDA device"/></testcase></testsuite></testsuites>')
    got = junit_summary(xml)
    assert (got["passed"], got["failed"], got["skipped"], got["total"]) == (1, 1, 1, 3)
    assert got["failures"] == ["a::bad: x differs"] and got["skips"] == {"no CUDA device": 1}


@pytest.mark.parametrize("phases", [("env",), ("bench",)])
def test_plan_selects_phases(tmp_path, phases):
    from gpu_check_steps import select
    steps = select(plan(tmp_path), phases)
    assert steps and {s.phase for s in steps} == set(phases)


def test_child_env_finds_carried_headers_and_wheel_site(tmp_path, monkeypatch):
    (tmp_path / ".third_party" / "tensorrt-11.1").mkdir(parents=True)
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    monkeypatch.setenv("ORT_ROOT", "/given")
    site = tmp_path / "site"
    (site / "bin").mkdir(parents=True)  # a wheel's scripts (cmake) must be found by the steps
    monkeypatch.setenv("PATH", "/usr/bin")
    env = gpu_check.child_env(site)
    assert env["PATH"].split(os.pathsep) == [str(site / "bin"), "/usr/bin"]
    assert env["TENSORRT_ROOT"] == str(tmp_path / ".third_party" / "tensorrt-11.1")
    assert env["ORT_ROOT"] == "/given"  # a set variable wins
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(site), str(tmp_path)]


def test_bench_server_keeps_the_wheel_site_on_its_pythonpath(monkeypatch, tmp_path):
    """`irpe bench serve` (bench/serve, tests/gpu/test_serve_cuda.py) starts `irpe serve` as a
    child: on the bare GPU image fastapi comes only from the wheel site that gpu-check puts on
    PYTHONPATH, so the child must keep it (after the checkout, which still wins)."""
    from benchmarks import serve_process
    seen = {}

    def popen(cmd, **kwargs):
        seen.update(kwargs["env"])
        raise RuntimeError("stop here")
    monkeypatch.setattr(serve_process.subprocess, "Popen", popen)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    with pytest.raises(RuntimeError, match="stop here"):
        serve_process.start_serve(["repo.yaml"], root=ROOT)
    assert seen["PYTHONPATH"].split(os.pathsep) == [str(ROOT), str(tmp_path / "site")]


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_timed_out_pytest_step_keeps_the_results_of_the_tests_that_ran(tmp_path, monkeypatch,
                                                                      sigint):
    """A step's timeout interrupts pytest (SIGINT) before killing it, so the JUnit XML of the
    tests that finished reaches the report instead of nothing, also when gpu-check itself runs
    with SIGINT ignored (a shell's background job: the step's child gets it back). The step's
    timeout expires once the slow test has started (a file it writes), not after a fixed time."""
    started = tmp_path / "slow-started"
    tests = tmp_path / "test_slow.py"
    tests.write_text(f"import time\n\ndef test_quick():\n    pass\n\n"
                     f"def test_slow():\n    open({str(started)!r}, 'w').close()\n"
                     f"    time.sleep(120)\n")
    step = Step("tests", "slow", "one quick, one slow", (
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)), 120,
        pytest=True)
    real, calls = subprocess.Popen.communicate, []

    def communicate(proc, input=None, timeout=None):
        calls.append(timeout)
        if len(calls) > 1:  # the grace period, then the final read: as they are
            return real(proc, input, timeout)
        for _ in range(1200):  # the step's timeout: when the slow test runs (at most 60 s)
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        raise subprocess.TimeoutExpired(proc.args, timeout)
    monkeypatch.setattr(subprocess.Popen, "communicate", communicate)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint == "ignored" else None
    try:
        result = gpu_check.run_step(step, 100.0, dict(os.environ))
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    assert started.exists() and calls[:2] == [100.0, gpu_check.GRACE_S], (calls, result["tail"])
    assert result["status"] == "timeout" and result["seconds"] < 60, result["tail"]
    assert result["tests"]["passed"] == 1, result
