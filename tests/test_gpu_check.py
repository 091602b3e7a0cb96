"""`make gpu-check` on CPU (issues 27, 41): the dry run prints the plan, proves by its timeouts
that the one-call window fits the budget (and the carry its size limits), and runs what needs
no GPU, with the serving stack blocked as on the bare GPU image, so tests/gpu must collect with
0 errors; steps die at their timeout; the budget guard skips; a second call resumes the report,
running only the steps not yet finished."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import BLOCKER, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402
import gpu_check_steps  # noqa: E402
from gpu_check_report import junit_summary, write_report  # noqa: E402
from gpu_check_steps import (  # noqa: E402
    BUDGET_S,
    CALL_WALL_S,
    DEVICE_S,
    HARNESS_BUILD,
    MACHINE_START_S,
    NAMED_TESTS,
    OVERHEAD_S,
    PHASES,
    SECOND_BUDGET_S,
    SECOND_CALL_WALL_S,
    WINDOW,
    Step,
    plan,
    window_seconds,
)

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
    # the budget arithmetic is checked (a plan that does not fit exits 1), and the carry's size
    # where make gpu-carry prepared it
    assert f"= {window_seconds(plan(tmp_path))} s <= {BUDGET_S} s budget: fits" in out, out
    assert "s wall: fits" in out and "DOES NOT FIT" not in out
    assert "carry: not prepared" in out or ("MiB <= 60 MiB: fits" in out
                                            and "MiB <= 64 MiB: fits" in out), out
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["env"]["serving_stack"] is False  # the block reached the script's process
    collect = doc["steps"]["env/collect"]
    assert collect["status"] == "passed" and collect["collect_errors"] == 0, collect["tail"]
    assert collect["collected"] > 100
    assert doc["steps"]["env/variants"]["status"] == "passed"
    assert not any(k.startswith(("correct/", "bench/", "rest/")) for k in doc["steps"])
    assert doc["runs"][-1]["dry_run"] is True
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("# gpu-check: no CUDA device") and "| env/collect | passed |" in md


def test_one_call_window_fits_eight_minutes_and_the_device_budget():
    """The window tiers' timeouts add up to the budget, the budget and start-up to one call of
    <= 8 minutes, and a start plus both calls to the 15 minutes of device time."""
    steps = plan(Path("/tmp/out"))
    assert PHASES[:len(WINDOW)] == WINDOW and {s.phase for s in steps} == set(PHASES)
    assert [s.phase for s in steps] == sorted((s.phase for s in steps), key=PHASES.index)
    assert window_seconds(steps) <= BUDGET_S and gpu_check.parse_args([]).budget == BUDGET_S
    assert BUDGET_S + OVERHEAD_S <= CALL_WALL_S <= 8 * 60
    assert MACHINE_START_S + CALL_WALL_S + SECOND_CALL_WALL_S <= DEVICE_S
    assert SECOND_BUDGET_S + OVERHEAD_S <= SECOND_CALL_WALL_S
    assert all(s.setup for s in steps if s.argv == ())  # in-process steps: every call
    for path in NAMED_TESTS:  # a renamed file would silently fall into rest/others
        assert (ROOT / path).is_file(), path
    lines, problems = gpu_check_steps.budget_lines(steps, 300)
    assert problems and "exceed the budget" in problems[0]


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
    assert gpu_check.main(["--steps", "correct/nope"]) == 2
    assert "no step matches correct/nope" in capsys.readouterr().err
    # a dry run with a budget the window does not fit: the guard skips, and the check fails;
    # a wheel site's bin/ goes on the steps' PATH, never on the caller's (CI once ran a stale
    # site's cmake in every later test)
    (tmp_path / "site" / "bin").mkdir(parents=True)
    path = os.environ["PATH"]
    assert gpu_check.main(["--phases", "env", "--dry-run", "--budget", "1", "--site",
                           str(tmp_path / "site"), "--out", str(tmp_path)]) == 1
    assert os.environ["PATH"] == path
    assert "PLAN DOES NOT FIT" in capsys.readouterr().out
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["env/collect"]["status"] == "skipped"
    assert steps["env/collect"]["reason"].startswith("budget")


def test_report_merges_calls_and_names_failures(tmp_path):
    facts = {"device_slug": "gpu-x", "device": "X", "date": "d", "load_avg": [0, 0, 0],
             "versions": {"torch": "2.11"}, "driver": "580"}
    write_report(tmp_path, facts, {"env/a": {"status": "passed", "seconds": 1}}, ["env"],
                 False, 1.0)
    bad = {"status": "failed", "tail": "boom", "tests": {
        "passed": 1, "failed": 1, "skipped": 0, "total": 2, "skips": {},
        "failures": ["t::test_variant_smoke[k-fp16]: boom"],
        "cases": {"test_variant_smoke[k-fp16]": "failed", "test_variant_smoke[k-bf16]": "passed"}}}
    write_report(tmp_path, facts, {"correct/variants": bad}, ["correct"], False, 2.0)
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(doc["steps"]) == {"env/a", "correct/variants"} and len(doc["runs"]) == 2
    md = (tmp_path / "gpu_check.md").read_text()
    assert "driver 580" in md and "torch 2.11" in md and "`k-fp16` failed" in md
    slow = {"passed": 2, "failed": 0, "skipped": 0, "total": 2, "skips": {}, "failures": [],
            "slowest": [["test_jit_build", 41.5], ["test_small", 0.2]]}
    write_report(tmp_path, facts, {"correct/cuda-ops": {
        "status": "passed", "seconds": 52.0, "plan_timeout_s": 80, "call": 1, "tests": slow}},
        ["correct"], False, 3.0)
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| correct/cuda-ops | passed | 52.0 | 80 | 1 |" in md  # measured beside its timeout
    assert "`test_jit_build` 41.5 s" in md


def test_junit_summary(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="a" name="ok"/>'
                   '<testcase classname="a" name="bad"><failure message="x differs">t'
                   '</failure></testcase><testcase classname="a" name="s"><skipped '
                   'message="no CUDA device"/></testcase></testsuite></testsuites>')
    got = junit_summary(xml)
    assert (got["passed"], got["failed"], got["skipped"], got["total"]) == (1, 1, 1, 3)
    assert [name for name, _ in got["slowest"]] == ["ok", "bad", "s"]  # no times: all 0
    assert got["failures"] == ["a::bad: x differs"] and got["skips"] == {"no CUDA device": 1}


@pytest.mark.parametrize("phases", [("env",), ("bench",)])
def test_plan_selects_phases(tmp_path, phases):
    from gpu_check_steps import select
    steps = select(plan(tmp_path), phases)
    assert steps and {s.phase for s in steps} == set(phases)
    picked = gpu_check.pick(plan(tmp_path), phases, None)  # + the setup steps, every call
    assert {s.key for s in picked} == {s.key for s in steps} | {
        s.key for s in plan(tmp_path) if s.setup}
    assert [s.key for s in gpu_check.pick(plan(tmp_path), tuple(PHASES), "correct/*")
            if not s.setup] == [s.key for s in plan(tmp_path) if s.phase == "correct"]


def test_child_env_finds_carried_headers_and_wheel_site(tmp_path, monkeypatch):
    (tmp_path / ".third_party" / "tensorrt-11.1").mkdir(parents=True)
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("ORT_ROOT", "/given")
    site = tmp_path / "site"
    (site / "bin").mkdir(parents=True)  # a wheel's scripts (cmake) must be found by the steps
    monkeypatch.setenv("PATH", "/usr/bin")
    env = gpu_check.child_env(site)
    assert env["PATH"].split(os.pathsep) == [str(site / "bin"), "/usr/bin"]
    assert env["TENSORRT_ROOT"] == str(tmp_path / ".third_party" / "tensorrt-11.1")
    assert env["ORT_ROOT"] == "/given"  # a set variable wins
    # the JIT caches live under /tmp, which the warm machine keeps between calls
    assert Path(env["TORCH_EXTENSIONS_DIR"]).name == "irpe_torch_ext"
    assert Path(env["TRITON_CACHE_DIR"]).name == "irpe_triton_cache"
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


FAKE_GPU = {"device_slug": "gpu-test-h100", "device": "Fake H100", "date": "d",
            "load_avg": [0, 0, 0], "versions": {}, "cuda_available": True, "cuda_arch": "90",
            "serving_stack": True, "onnxruntime_providers": ["CPUExecutionProvider"]}


@pytest.fixture
def fake_gpu(monkeypatch):
    """gpu_check on a pretend GPU machine: every step "runs" at once with the outcome the test
    sets (default passed), and the names of the steps run are recorded."""
    ran, outcome = [], {}
    monkeypatch.setattr(gpu_check, "env_facts", lambda: dict(FAKE_GPU))
    monkeypatch.setattr(gpu_check, "install_wheels", lambda site, dry, timeout_s: {
        "status": "skipped", "reason": "test"})
    monkeypatch.setattr(gpu_check, "install_prebuilt", lambda dry, arch, headers: {
        "status": "skipped", "reason": "test"})

    def run_step(step, timeout_s, env):
        ran.append(step.key)
        return {"status": outcome.get(step.key, "passed"), "seconds": 1.0,
                "timeout_s": round(timeout_s)}
    monkeypatch.setattr(gpu_check, "run_step", run_step)
    return ran, outcome


def _runnable(*phases):
    """Steps that run as processes on the fake machine (no ORT CUDA EP: those skip)."""
    return [s.key for s in plan(Path("/x")) if s.argv and s.phase in phases
            and "ort-cuda" not in s.needs]


def test_second_call_resumes_only_the_unfinished_steps(tmp_path, fake_gpu, capsys):
    """Call 1 ends part-way (here: it ran env + correct; one step failed, one timed out, and one
    was still running when the call was killed); call 2 runs only what is not final: the killed
    step, the timed-out step once more, and every step call 1 did not reach. Call 3 has nothing
    left but the second timeout; --fresh starts over."""
    ran, outcome = fake_gpu
    out = str(tmp_path)
    outcome.update({"correct/variants": "failed", "correct/defects": "timeout"})
    assert gpu_check.main(["--out", out, "--phases", "env,correct"]) == 1
    assert ran == _runnable("env", "correct")
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["steps"]["correct/cuda-ops"]["call"] == 1
    doc["steps"]["correct/trt-harness"] = {"status": "running", "call": 1, "timeout_s": 40}
    (tmp_path / "gpu_check.json").write_text(json.dumps(doc))  # as a killed call leaves it

    ran.clear()
    assert gpu_check.main(["--out", out]) == 1  # the defects step times out again
    assert ran == ["correct/trt-harness", "correct/defects"] + _runnable("bench", "rest")
    printed = capsys.readouterr().out
    assert "resuming" in printed and "[DONE] correct/cuda-ops: passed in call 1" in printed
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["call"] for r in doc["runs"]] == [1, 2]
    assert doc["steps"]["correct/cuda-ops"]["call"] == 1
    assert doc["steps"]["correct/trt-harness"]["call"] == 2
    assert doc["steps"]["correct/defects"]["tries"] == 2
    assert doc["steps"]["correct/variants"]["status"] == "failed"  # failed: final, kept

    ran.clear()
    assert gpu_check.main(["--out", out]) == 0
    assert ran == []
    assert gpu_check.main(["--out", out, "--steps", "correct/defects"]) == 1  # forced
    assert ran == ["correct/defects"]
    ran.clear()
    assert gpu_check.main(["--out", out, "--fresh", "--phases", "env,correct"]) == 1
    assert ran == _runnable("env", "correct")


def test_budget_cut_steps_and_other_code_are_not_resumed_past(tmp_path, fake_gpu,
                                                              monkeypatch):
    """Steps the budget guard skipped run in the next call; a report of other code (another
    fingerprint) is not resumed."""
    ran, _ = fake_gpu
    out = str(tmp_path)
    assert gpu_check.main(["--out", out, "--phases", "env,correct", "--budget", "10"]) == 0
    assert ran == []
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["correct/cuda-ops"]["reason"].startswith("budget")
    assert gpu_check.main(["--out", out, "--phases", "env,correct"]) == 0
    assert ran == _runnable("env", "correct")
    ran.clear()
    monkeypatch.setattr(gpu_check, "fingerprint", lambda: "other code")
    assert gpu_check.main(["--out", out, "--phases", "env,correct"]) == 0
    assert ran == _runnable("env", "correct")


def test_carry_sizes_are_checked(tmp_path, monkeypatch):
    lines, problems = gpu_check_steps.carry_lines(tmp_path)
    assert lines[0].startswith("carry: not prepared") and not problems
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "a.whl").write_bytes(b"x" * 2**20)
    lines, problems = gpu_check_steps.carry_lines(tmp_path)
    assert lines[0] == "carry: .whl 1.0 = 1.0 MiB <= 60 MiB: fits" and not problems
    assert "no git" in lines[1]
    monkeypatch.setattr(gpu_check_steps, "CARRY_LIMIT_MIB", 0.5)
    assert "exceeds" in gpu_check_steps.carry_lines(tmp_path)[1][0]


@pytest.mark.skipif(shutil.which("ldd") is None or shutil.which("true") is None,
                    reason="needs ldd and a dynamically linked `true`")
def test_prebuilt_harness_is_put_in_place_only_when_current_and_loadable(tmp_path, monkeypatch):
    """A .gpu-prebuilt/ harness build is copied to where the GPU test looks (build/
    test-trt-harness/<key>) only when its key is this checkout's and ldd resolves it."""
    from tests.trt_harness import cases
    headers = tmp_path / "tensorrt-11.1" / "include"
    headers.mkdir(parents=True)
    for name in ("NvInferVersion.h", "NvInferRuntime.h"):
        (headers / name).write_text(f"// {name}\n")
    assert gpu_check.harness_headers({"TENSORRT_ROOT": str(headers.parent)}) == headers
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    key = cases.build_folder(tmp_path / HARNESS_BUILD, "90", headers).name
    carried = tmp_path / ".gpu-prebuilt" / "trt-harness"
    for folder in (carried / key, carried / "0123456789ab"):
        for path in cases.artifacts(folder).values():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(shutil.which("true"), path)  # an ELF whose libraries resolve
    dry = gpu_check.install_prebuilt(True, "90", headers)
    assert dry["status"] == "planned" and not (tmp_path / HARNESS_BUILD).exists()
    got = gpu_check.install_prebuilt(False, "90", headers)
    assert got["status"] == "passed" and got["installed"] == [f"trt-harness/{key}"]
    assert "0123456789ab: not this checkout's sm_90 build" in got["reason"]
    assert cases.is_built(tmp_path / HARNESS_BUILD, "90", headers)
    shutil.rmtree(tmp_path / HARNESS_BUILD)
    (carried / key / "trt_harness").write_text("not an ELF")
    got = gpu_check.install_prebuilt(False, "90", headers)
    assert got["status"] == "skipped" and "not used" in got["reason"]
    assert not (tmp_path / HARNESS_BUILD).exists()


def test_a_call_stopped_from_outside_keeps_its_report(tmp_path, fake_gpu, monkeypatch):
    """SIGTERM/SIGINT to gpu-check (an outer `timeout`, the device tool's limit) mid-step: the
    report keeps the steps that ended, the cut step reads "running", the next call reruns it."""
    ran, _ = fake_gpu
    real = gpu_check.run_step

    def stopped(step, timeout_s, env):
        if step.key == "correct/fused-attention":
            raise KeyboardInterrupt
        return real(step, timeout_s, env)
    monkeypatch.setattr(gpu_check, "run_step", stopped)
    assert gpu_check.main(["--out", str(tmp_path), "--phases", "env,correct"]) == 130
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["correct/cuda-ops"]["status"] == "passed"
    assert steps["correct/fused-attention"]["status"] == "running"
    assert "correct/trt-harness" not in steps
    monkeypatch.setattr(gpu_check, "run_step", real)
    ran.clear()
    assert gpu_check.main(["--out", str(tmp_path), "--phases", "env,correct"]) == 0
    assert ran == ["correct/fused-attention", "correct/trt-harness", "correct/defects",
                   "correct/variants"]


def test_sigterm_stops_the_running_step_with_gpu_check(tmp_path):
    """gpu-check under SIGTERM takes its running step's process group down with it (a step is
    its own session, so the signal to gpu-check's group does not reach it)."""
    pidfile = tmp_path / "pid"
    script = f"""
import sys, signal, os
sys.path.insert(0, {str(ROOT / 'scripts')!r})
import gpu_check
from gpu_check_steps import Step
signal.signal(signal.SIGTERM, gpu_check._stop)
step = Step("correct", "sleep", "sleeps", (sys.executable, "-c",
            "import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"),
            60)
try:
    gpu_check.run_step(step, 60, dict(os.environ))
except KeyboardInterrupt:
    print("stopped", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    for _ in range(600):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    child = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "stopped" in out
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
