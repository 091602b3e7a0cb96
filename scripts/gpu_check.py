#!/usr/bin/env python3
"""`make gpu-check`: one command that gives a GPU machine's verdict on this checkout.

    python scripts/gpu_check.py [--call N | --phases env,tests,probes,bench] [--out DIR]
                                [--budget SECONDS] [--dry-run]

Phases env, tests, probes, bench (scripts/gpu_check_steps.py); every step is a child process
under its own timeout, and a time budget skips the steps that would not fit. Results: one
Markdown + JSON report (gpu_check.md / .json, merged over calls) in --out (default
benchmarks/results/<device>/). Never downloads: wheels carried in .whl/ are installed into
--site with pip --no-index. --dry-run prints the plan and runs the steps that need no GPU.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_steps import CALLS, CARRIED_ROOTS, PHASES, ROOT, Step, plan, select  # noqa: E402

sys.path.insert(1, str(ROOT))
from gpu_check_report import env_facts, junit_summary, write_report  # noqa: E402

MIN_STEP_S = 20  # a step with less time left than this is skipped ("budget")
GRACE_S = 10      # after a timeout's SIGINT, seconds for pytest to write its results
TAIL = 4000       # characters of a step's output kept in the report


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", help=f"comma-separated, of {', '.join(PHASES)} (default: all)")
    p.add_argument("--call", type=int, choices=sorted(CALLS), help="the phases of call N of "
                   "three (" + "; ".join(f"{n}: {'+'.join(ph)}" for n, ph in CALLS.items()) + ")")
    p.add_argument("--out", type=Path, help="report folder (default benchmarks/results/<device>)")
    p.add_argument("--budget", type=float, default=530.0,
                   help="seconds this run may take; steps that would not fit are skipped")
    p.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "irpe-gpu-site",
                   help="where the wheels of .whl/ are installed (pip --target)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; run only the steps "
                   "that need no GPU")
    return p.parse_args(argv)


def phases_of(args: argparse.Namespace) -> Tuple[str, ...]:
    if args.call and args.phases:
        raise ValueError("give --call or --phases, not both")
    if args.call:
        return CALLS[args.call]
    return tuple(p.strip() for p in (args.phases or ",".join(PHASES)).split(",") if p.strip())


def install_wheels(site: Path, dry: bool) -> Dict:
    """pip --no-index --target SITE of .whl/*.whl (the serving stack on a bare GPU machine)."""
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if not wheels:
        return {"status": "skipped", "reason": "no .whl/*.whl (../shared/gpu/fetch-wheels.sh)"}
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
            *map(str, wheels)]
    if dry:
        return {"status": "planned", "command": " ".join(argv[:11]) + " .whl/*.whl"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": 180, "wheels": len(wheels)}
    ok = done.returncode == 0
    if ok:
        sys.path.insert(0, str(site))
    return {"status": "passed" if ok else "failed", "wheels": len(wheels),
            "tail": (done.stdout + done.stderr)[-TAIL:]}


def missing(step: Step, have: Dict[str, bool]) -> Optional[str]:
    """Why ``step`` cannot run here, or None."""
    reasons = {"cuda": "no CUDA device (torch.cuda.is_available() is False)",
               "serving": "serving stack not importable (carry .whl from fetch-wheels.sh)",
               "ort-cuda": "onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu not "
                           "installed)"}
    return next((reasons[n] for n in step.needs if not have.get(n)), None)


def child_env(site: Path) -> Dict[str, str]:
    """The steps' environment: wheels and the checkout on PYTHONPATH, the wheels' scripts on
    PATH (e.g. cmake from a carried cmake wheel: the plugin harness builds with it), a writable
    extension cache, and header roots carried in .third_party/ where the variables are unset."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for var, pattern in CARRIED_ROOTS.items():
        found = sorted((ROOT / ".third_party").glob(pattern))
        if not env.get(var) and found:
            env[var] = str(found[-1])
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(tempfile.gettempdir()) / "torch_ext"))
    parts = [str(site)] if site.is_dir() else []
    env["PYTHONPATH"] = os.pathsep.join(parts + [str(ROOT)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if (site / "bin").is_dir():
        env["PATH"] = os.pathsep.join([str(site / "bin")] + ([env["PATH"]] if env.get("PATH")
                                                             else []))
    return env


def run_step(step: Step, timeout_s: float, env: Dict[str, str]) -> Dict:
    """Run one step in its own process group. At the timeout the group gets SIGINT (pytest then
    stops and still writes its JUnit XML: the tests that ran keep their results), and SIGKILL
    GRACE_S seconds later if it is still running."""
    argv, xml = list(step.argv), None
    if step.pytest:
        xml = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "junit.xml"
        argv += [f"--junitxml={xml}"]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        status = "passed" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        status = "timeout"
    result = {"status": status, "rc": proc.returncode, "seconds": round(time.monotonic() - start,
                                                                         1),
              "timeout_s": round(timeout_s), "command": shlex.join(step.argv), "tail": out[-TAIL:]}
    collected = re.search(r"(\d+) tests? collected(?:, (\d+) errors?)?", out)
    if collected:
        result["collected"], result["collect_errors"] = int(collected[1]), int(collected[2] or 0)
    if xml is not None and xml.is_file():
        result["tests"] = junit_summary(xml)
        if status == "passed" and result["tests"]["total"] == result["tests"]["skipped"] > 0:
            result["status"] = "skipped"
    return result


def _default_sigint() -> None:
    """In the step's child, before exec: SIGINT at its default action. A background job of a
    shell inherits SIGINT ignored, and a Python started so installs no KeyboardInterrupt
    handler: the timeout's SIGINT would then not stop pytest, and its results would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the whole group has just exited
        pass


def print_plan(steps: List[Step], budget: float, have: Dict[str, bool], dry: bool) -> None:
    print(f"gpu-check plan (budget {budget:.0f} s; calls: " + "; ".join(
        f"{n} = {'+'.join(p)}" for n, p in CALLS.items()) + ")")
    for s in steps:
        why = missing(s, have)
        mode = "run" if (s.dry or not dry) and not why else f"skip: {why}" if why else "GPU only"
        print(f"  {s.key:<26} <= {s.timeout_s:>3} s  {s.what}  [{mode}]")
        if s.argv:
            print(f"      $ {shlex.join(s.argv)}")


def run(args: argparse.Namespace) -> int:
    """Run the selected phases; write the report; 0 when no step failed or timed out."""
    started = time.monotonic()
    phases = phases_of(args)
    wheels = install_wheels(args.site, args.dry_run)
    env = child_env(args.site)
    if env.get("PATH"):
        os.environ["PATH"] = env["PATH"]  # the facts name the tools the steps will find
    facts = env_facts()
    out = args.out or ROOT / "benchmarks" / "results" / facts["device_slug"]
    have = {"cuda": facts["cuda_available"], "serving": facts["serving_stack"],
            "ort-cuda": "CUDAExecutionProvider" in facts.get("onnxruntime_providers", [])}
    steps = select(plan(out, facts.get("cuda_arch") or "90"), phases)
    print_plan(steps, args.budget, have, args.dry_run)
    results: Dict[str, Dict] = {"env/wheels": wheels}
    facts["header_roots"] = {v: env.get(v) for v in CARRIED_ROOTS}
    for step in steps:
        left = args.budget - (time.monotonic() - started)
        why = missing(step, have)
        if args.dry_run and not step.dry:
            continue
        if step.name == "versions":
            results[step.key] = {"status": "passed", "facts": facts}
        elif why:
            results[step.key] = {"status": "skipped", "reason": why}
        elif left < MIN_STEP_S:
            results[step.key] = {"status": "skipped", "reason": f"budget: {left:.0f} s left"}
        else:
            results[step.key] = run_step(step, min(step.timeout_s, left - 5 - GRACE_S), env)
        _say(step.key, results[step.key])
    failed = [k for k, r in results.items() if r["status"] in ("failed", "timeout")]
    if args.dry_run and args.out is None:
        print("dry run: no report written (give --out to write one)")
    else:
        paths = write_report(out, facts, results, phases, args.dry_run,
                             time.monotonic() - started)
        print("wrote " + ", ".join(map(str, paths)))
    print(f"gpu-check: {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


def _say(key: str, result: Dict) -> None:
    tests = result.get("tests")
    counts = f" ({tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} " \
             f"skipped)" if tests and tests["total"] else ""
    if "collected" in result:
        counts = f" ({result['collected']} collected, {result['collect_errors']} errors)"
    extra = f": {result['reason']}" if "reason" in result else ""
    secs = f" in {result['seconds']} s" if "seconds" in result else ""
    print(f"[{result['status'].upper()}] {key}{secs}{counts}{extra}", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return run(parse_args(argv))
    except ValueError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
