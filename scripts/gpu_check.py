#!/usr/bin/env python3
"""`make gpu-check`: one command that gives a GPU machine's verdict on this checkout.

    python scripts/gpu_check.py [--phases env,correct,bench,rest] [--steps KEY,...] [--out DIR]
                                [--budget SECONDS] [--fresh] [--dry-run]

One call runs the plan (scripts/gpu_check_steps.py) in order of value: env -> correct -> bench
-> rest; every step is a child process under its own timeout, and the budget guard skips what
would not fit. Results: one Markdown + JSON report (gpu_check.md / .json) in --out (default
benchmarks/results/<device>/), written after every step. A second call resumes that report:
it runs only the steps not yet finished (--fresh starts over). Never downloads: wheels carried
in .whl/ are installed into --site with pip --no-index. --dry-run prints the plan, checks its
budget arithmetic and the carry's size, and runs the steps that need no GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_steps import (  # noqa: E402
    BUDGET_S,
    CACHE_DIRS,
    CARRIED_ROOTS,
    HARNESS_BUILD,
    ORT_GPU_WHY,
    PHASES,
    PREBUILT,
    ROOT,
    SECOND_BUDGET_S,
    WINDOW,
    Step,
    budget_lines,
    carry_lines,
    fingerprint,
    plan,
    select,
)

sys.path.insert(1, str(ROOT))
from gpu_check_report import (  # noqa: E402
    env_facts,
    finished,
    junit_summary,
    load_report,
    new_report,
    run_record,
    save_report,
)

MIN_STEP_S = 20  # a step with less time left than this is skipped ("budget")
GRACE_S = 10      # after a timeout's SIGINT, seconds for pytest to write its results
TAIL = 4000       # characters of a step's output kept in the report
WHEEL_MARK = ".irpe-wheels"  # in --site: the wheels installed there (a warm machine's 2nd call)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", help=f"comma-separated, of {', '.join(PHASES)} (default: all)")
    p.add_argument("--steps", help="comma-separated step keys or globs (e.g. 'correct/*'): run "
                   "just these, even when the report has them finished")
    p.add_argument("--out", type=Path, help="report folder (default benchmarks/results/<device>)")
    p.add_argument("--budget", type=float, default=float(BUDGET_S),
                   help=f"seconds this call may take; steps that would not fit are skipped "
                   f"(default {BUDGET_S}: one call of <= 8 minutes; a resuming second call: "
                   f"{SECOND_BUDGET_S})")
    p.add_argument("--fresh", action="store_true", help="start a new report instead of "
                   "resuming the one in --out")
    p.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "irpe-gpu-site",
                   help="where the wheels of .whl/ are installed (pip --target)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and check its budget "
                   "and the carry; run only the steps that need no GPU")
    return p.parse_args(argv)


def phases_of(args: argparse.Namespace) -> Tuple[str, ...]:
    return tuple(p.strip() for p in (args.phases or ",".join(PHASES)).split(",") if p.strip())


def pick(steps: List[Step], phases: Tuple[str, ...], patterns: Optional[str]) -> List[Step]:
    """The setup steps (always) and the steps of ``phases`` matching --steps (all without it);
    an unknown phase or a pattern that matches no step is an error."""
    chosen = {s.key for s in select(steps, phases)}
    if patterns:
        wanted = [p.strip() for p in patterns.split(",") if p.strip()]
        unmatched = [w for w in wanted if not any(fnmatch.fnmatch(s.key, w) for s in steps)]
        if unmatched:
            raise ValueError(f"no step matches {', '.join(unmatched)}; steps: "
                             f"{', '.join(s.key for s in steps)}")
        chosen &= {s.key for s in steps if any(fnmatch.fnmatch(s.key, w) for w in wanted)}
    return [s for s in steps if s.setup or s.key in chosen]


def install_wheels(site: Path, dry: bool, timeout_s: float) -> Dict:
    """pip --no-index --target SITE of .whl/*.whl (the serving stack on a bare GPU machine);
    nothing to do when SITE already holds the same wheels (a warm machine's next call)."""
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if not wheels:
        return {"status": "skipped", "reason": "no .whl/*.whl (make gpu-carry)"}
    names = "\n".join(w.name for w in wheels)
    mark = site / WHEEL_MARK
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
            *map(str, wheels)]
    if dry:
        return {"status": "planned", "command": " ".join(argv[:11]) + " .whl/*.whl"}
    start = time.monotonic()
    if mark.is_file() and mark.read_text() == names:
        sys.path.insert(0, str(site))
        return {"status": "passed", "wheels": len(wheels), "seconds": 0.0,
                "note": f"already installed in {site}"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": round(timeout_s), "wheels": len(wheels),
                "seconds": round(time.monotonic() - start, 1)}
    ok = done.returncode == 0
    if ok:
        sys.path.insert(0, str(site))
        mark.write_text(names)
    return {"status": "passed" if ok else "failed", "wheels": len(wheels),
            "seconds": round(time.monotonic() - start, 1),
            "tail": (done.stdout + done.stderr)[-TAIL:]}


def _unloadable(path: Path) -> Optional[str]:
    """What ldd cannot resolve for ``path`` (a missing library, a too-old libc), or None."""
    try:
        done = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"ldd failed: {exc}"
    bad = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if "not found" in ln]
    return "; ".join(bad) if bad or done.returncode == 0 else (done.stderr.strip() or "ldd failed")


def harness_headers(env: Dict[str, str]) -> Optional[Path]:
    """The TensorRT headers the steps' harness test will use: $TENSORRT_ROOT/include of the
    steps' environment (the carried .third_party/), else tools.trt_plugin_build's search."""
    root = env.get("TENSORRT_ROOT")
    if root and (Path(root) / "include" / "NvInferRuntime.h").is_file():
        return Path(root) / "include"
    from tools import trt_plugin_build
    return trt_plugin_build.find_headers()


def install_prebuilt(dry: bool, arch: str, headers: Optional[Path]) -> Dict:
    """Put the builds of .gpu-prebuilt/ (make gpu-carry: the TensorRT plugin harness for sm_90)
    where the GPU tests look for them, when ldd resolves every library they need here; a build
    for other sources, headers or architecture stays unused (the test then builds its own)."""
    start = time.monotonic()
    found = sorted(p for p in (ROOT / PREBUILT / "trt-harness").glob("*") if p.is_dir())
    if not found:
        return {"status": "skipped", "reason": "no .gpu-prebuilt/ (make gpu-carry)"}
    notes, installed = [], []
    try:
        from tests.trt_harness import cases
        want = cases.build_folder(ROOT / HARNESS_BUILD, arch, headers).name if headers else None
    except Exception as exc:  # noqa: BLE001 - e.g. onnx missing: the test could not run anyway
        return {"status": "failed", "reason": f"cannot key the harness build: {exc}"}
    for folder in found:
        if want is not None and folder.name != want:
            notes.append(f"trt-harness/{folder.name}: not this checkout's sm_{arch} build "
                         f"({want}): sources changed since make gpu-carry?")
            continue
        files = cases.artifacts(folder)
        missing = [str(p.relative_to(folder)) for p in files.values() if not p.is_file()]
        why = f"incomplete ({', '.join(missing)})" if missing else \
            next(filter(None, (_unloadable(files[k]) for k in ("exe", "library", "static"))),
                 None)
        if why:
            notes.append(f"trt-harness/{folder.name}: not used: {why}")
            continue
        if not dry:
            dest = ROOT / HARNESS_BUILD / folder.name
            for src in files.values():
                target = dest / src.relative_to(folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
        installed.append(f"trt-harness/{folder.name}")
    status = "planned" if dry and installed else "passed" if installed else "skipped"
    result = {"status": status, "installed": installed, "seconds": round(time.monotonic() -
                                                                         start, 1)}
    if notes:
        result["reason"] = "; ".join(notes)
    return result


def missing(step: Step, have: Dict[str, bool]) -> Optional[str]:
    """Why ``step`` cannot run here, or None."""
    reasons = {"cuda": "no CUDA device (torch.cuda.is_available() is False)",
               "serving": "serving stack not importable (carry .whl: make gpu-carry)",
               "ort-cuda": ORT_GPU_WHY}
    return next((reasons[n] for n in step.needs if not have.get(n)), None)


def child_env(site: Path) -> Dict[str, str]:
    """The steps' environment: wheels and the checkout on PYTHONPATH, the wheels' scripts on
    PATH (e.g. cmake from a carried cmake wheel), the JIT caches under /tmp (they persist on the
    warm machine, so one build serves every step and call), and header roots carried in
    .third_party/ where the variables are unset."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for var, pattern in CARRIED_ROOTS.items():
        found = sorted((ROOT / ".third_party").glob(pattern))
        if not env.get(var) and found:
            env[var] = str(found[-1])
    for var, name in CACHE_DIRS.items():
        env.setdefault(var, str(Path(tempfile.gettempdir()) / name))
    parts = [str(site)] if site.is_dir() else []
    env["PYTHONPATH"] = os.pathsep.join(parts + [str(ROOT)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if (site / "bin").is_dir():
        env["PATH"] = os.pathsep.join([str(site / "bin")] + ([env["PATH"]] if env.get("PATH")
                                                             else []))
    return env


@contextlib.contextmanager
def process_path(path: Optional[str]) -> Iterator[None]:
    """This process's PATH set to ``path`` for the block, then restored: an in-process caller
    (a test) keeps its own, so a wheel site's bin/ never outlives the call."""
    saved = os.environ.get("PATH")
    if path:
        os.environ["PATH"] = path
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


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
    except KeyboardInterrupt:  # gpu-check itself is being stopped: take the step down with it
        _signal_group(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
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


def previous_report(out: Path, facts: Dict, code: str, fresh: bool) -> Tuple[Dict, str]:
    """The report this call resumes, and a line saying which: the one in ``out``, else the
    checkout's results folder for this device (a first call's report, committed), when it is
    of this device and this code; else a new one."""
    if fresh:
        return new_report(), "--fresh: a new report"
    default = ROOT / "benchmarks" / "results" / facts["device_slug"]
    why = "no report yet: a new one"
    for folder in dict.fromkeys([out, default]):
        doc = load_report(folder / "gpu_check.json")
        if doc is None:
            continue
        if doc.get("device_slug") != facts["device_slug"]:
            why = f"{folder}: another device's report ({doc.get('device_slug')}): a new one"
        elif doc.get("fingerprint") != code:
            why = f"{folder}: a report of other code (fingerprint differs): a new one"
        else:
            setup = {s.key for s in plan(out) if s.setup}
            done = sum(finished(r) for k, r in doc["steps"].items() if k not in setup)
            return doc, f"resuming {folder / 'gpu_check.json'} ({done} steps finished)"
    return new_report(), why


def print_plan(steps: List[Step], doc: Dict, budget: float, have: Dict[str, bool], dry: bool,
               forced: bool) -> None:
    print(f"gpu-check plan: {len(steps)} steps, budget {budget:.0f} s, in order of value "
          f"({' -> '.join(PHASES)}; docs/gpu-check.md)")
    total, marked = 0, False
    for s in steps:
        if s.phase not in WINDOW and not marked:
            print(f"  ---- end of the one-call window: {total} s of timeouts ----")
            marked = True
        total += s.timeout_s
        prior = doc["steps"].get(s.key, {})
        why = missing(s, have)
        if finished(prior) and not s.setup and not forced:
            mode = f"done: {prior['status']} in call {prior.get('call', '?')}, " \
                   f"{prior.get('seconds')} s"
        elif why:
            mode = f"skip: {why}"
        elif dry and s.setup and not s.dry:
            mode = "check only"
        else:
            mode = "run" if (s.dry or not dry) else "GPU only"
        print(f"  {s.key:<23} <= {s.timeout_s:>3} s  (sum {total:>4})  {s.what}  [{mode}]")
        if s.argv:
            print(f"      $ {shlex.join(s.argv)}")


def run(args: argparse.Namespace) -> int:
    """Run the selected steps not yet finished; write the report after each; 0 when no step of
    this call failed or timed out (a dry run: and the budget and the carry fit)."""
    started = time.monotonic()
    phases = phases_of(args)
    select(plan(ROOT), phases)  # an unknown phase: an error before anything runs
    wheels = install_wheels(args.site, args.dry_run, _timeout("env/wheels"))
    env = child_env(args.site)
    facts_start = time.monotonic()
    with process_path(env.get("PATH")):  # the facts name the tools the steps will find
        facts = env_facts()
    facts_s = round(time.monotonic() - facts_start, 1)
    facts["header_roots"] = {v: env.get(v) for v in CARRIED_ROOTS}
    facts["caches"] = {v: env.get(v) for v in CACHE_DIRS}
    out = args.out or ROOT / "benchmarks" / "results" / facts["device_slug"]
    arch = facts.get("cuda_arch")
    every = plan(out, arch or "90")
    steps = pick(every, phases, args.steps)
    code = fingerprint()
    doc, resumed = previous_report(out, facts, code, args.fresh)
    calls = [r for r in doc["runs"] if not r.get("dry_run")]
    call = len(calls) + (0 if args.dry_run else 1)
    save = not (args.dry_run and args.out is None)
    doc.update(device_slug=facts["device_slug"], env=facts, fingerprint=code)
    this_run = dict(run_record(facts, phases, args.dry_run, 0.0), call=call, resumed=resumed)
    doc["runs"].append(this_run)
    results: Dict[str, Dict] = {}

    def record(step: Step, result: Dict) -> None:
        result.update(call=call, dry_run=args.dry_run, plan_timeout_s=step.timeout_s)
        results[step.key] = doc["steps"][step.key] = result
        this_run["seconds"] = round(time.monotonic() - started, 1)
        if save:
            save_report(out, doc)

    print(resumed)
    have = {"cuda": facts["cuda_available"], "serving": facts["serving_stack"],
            "ort-cuda": "CUDAExecutionProvider" in facts.get("onnxruntime_providers", [])}
    forced = bool(args.steps)
    print_plan(steps, doc, args.budget, have, args.dry_run, forced)
    budget, budget_problems = budget_lines(every, args.budget)
    carry, carry_problems = carry_lines()
    for line in budget + carry:
        print(line)
    problems = budget_problems + carry_problems if args.dry_run else []
    try:
        _run_steps(steps, doc, record, args, started, have, env, facts, facts_s, wheels, arch)
    except KeyboardInterrupt:
        print("gpu-check: stopped from outside (SIGINT/SIGTERM); the report keeps the steps that "
              "ended, and the one cut short reads \"running\": the next call runs it again")
        if save:
            save_report(out, doc)
        return 130
    failed = [k for k, r in results.items() if r["status"] in ("failed", "timeout")]
    if save:
        print("wrote " + ", ".join(map(str, save_report(out, doc))))
    else:
        print("dry run: no report written (give --out to write one)")
    left = [s.key for s in every if not finished(doc["steps"].get(s.key, {}))
            and not s.setup and not missing(s, have)]
    if not args.dry_run and left:
        print(f"left for the next call ({len(left)}): {', '.join(left)}; `make gpu-check` again "
              f"resumes (--budget {SECOND_BUDGET_S} for a second call of the window)")
    for problem in problems:
        print(f"gpu-check: PLAN DOES NOT FIT: {problem}")
    print(f"gpu-check: {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed or problems else 0


def _run_steps(steps: List[Step], doc: Dict, record, args: argparse.Namespace, started: float,
               have: Dict[str, bool], env: Dict[str, str], facts: Dict, facts_s: float,
               wheels: Dict, arch: Optional[str]) -> None:
    """Each step in order: skipped when final in the report (not setup, not forced), when its
    needs are missing or the budget is spent; else run and recorded."""
    forced = bool(args.steps)
    for step in steps:
        left = args.budget - (time.monotonic() - started)
        why = missing(step, have)
        prior = doc["steps"].get(step.key, {})
        if args.dry_run and not step.dry and not step.setup:
            continue
        if finished(prior) and not step.setup and not forced:
            print(f"[DONE] {step.key}: {prior['status']} in call {prior.get('call', '?')}")
            continue
        if step.key == "env/wheels":
            result = wheels
        elif step.key == "env/prebuilt":
            result = install_prebuilt(args.dry_run, arch or "90", harness_headers(env))
        elif step.key == "env/versions":
            result = {"status": "passed", "seconds": facts_s, "facts": facts}
        elif step.key == "env/variants":
            result = _variants()
        elif why:
            result = {"status": "skipped", "reason": why}
        elif left < MIN_STEP_S:
            result = {"status": "skipped", "reason": f"budget: {left:.0f} s left"}
        else:
            record(step, {"status": "running", "reason": "the call ended during this step",
                          "timeout_s": step.timeout_s})
            result = run_step(step, min(step.timeout_s, left - 5 - GRACE_S), env)
            result["tries"] = prior.get("tries", 0) + 1 if prior.get("status") == "timeout" \
                else 1
        record(step, result)
        _say(step.key, result)


def _timeout(key: str) -> int:
    return next(s.timeout_s for s in plan(ROOT) if s.key == key)


def _variants() -> Dict:
    """The fused kernels' variant families (in-process: no second interpreter start)."""
    start = time.monotonic()
    try:
        from tools.fused_variants import variants
        names = [v.name for v in variants()]
    except Exception as exc:  # noqa: BLE001 - reported as the step's failure
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                "seconds": round(time.monotonic() - start, 1)}
    return {"status": "passed", "count": len(names), "variants": names,
            "seconds": round(time.monotonic() - start, 1)}


def _say(key: str, result: Dict) -> None:
    tests = result.get("tests")
    counts = f" ({tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} " \
             f"skipped)" if tests and tests["total"] else ""
    if "collected" in result:
        counts = f" ({result['collected']} collected, {result['collect_errors']} errors)"
    extra = f": {result['reason']}" if "reason" in result else ""
    secs = f" in {result['seconds']} s" if "seconds" in result else ""
    print(f"[{result['status'].upper()}] {key}{secs}{counts}{extra}", flush=True)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[List[str]] = None) -> int:
    # SIGTERM (e.g. `timeout 480 make gpu-check ...` on the lent machine) stops the running step
    # and keeps the report, as Ctrl-C does
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return run(parse_args(argv))
    except ValueError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
