"""Facts and report files of `make gpu-check` (scripts/gpu_check.py): the machine's versions,
pytest's JUnit XML summarised, and gpu_check.json + gpu_check.md, merged over the calls that
resume one report; each step's measured seconds beside its timeout, to re-size the plan."""
from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SLOWEST = 5  # slowest tests of a step kept in the report (JUnit times): where its time went
PACKAGES = ("torch", "triton", "torchvision", "numpy", "onnx", "onnxruntime", "onnxruntime-gpu",
            "fastapi", "pydantic", "uvicorn", "matplotlib", "tensorrt")


def _run(argv: Sequence[str], timeout: float = 5) -> str:
    """stdout of a short command, or '' when it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - missing, or present but broken
        return False
    return True


def env_facts() -> Dict:
    """Device, driver, CUDA, library versions; what the later steps need (no GPU needed)."""
    import torch
    facts: Dict = {"python": platform.python_version(), "torch_cuda": torch.version.cuda,
                   "cuda_available": torch.cuda.is_available(), "cpu_count": os.cpu_count(),
                   "load_avg": [round(x, 2) for x in os.getloadavg()],
                   "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    facts["versions"] = {}
    for pkg in PACKAGES:
        try:
            facts["versions"][pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                "--format=csv,noheader"])
    facts["nvidia_smi"] = smi or "nvidia-smi not found or failed"
    facts["driver"] = smi.split(",")[1].strip() if smi.count(",") >= 2 else None
    nvcc = _run(["nvcc", "--version"]).splitlines()
    facts["nvcc"] = nvcc[-1] if nvcc else "nvcc not found"
    facts["cmake"] = (_run(["cmake", "--version"]).splitlines() or ["cmake not found"])[0]
    if facts["cuda_available"]:
        cap = torch.cuda.get_device_capability()
        facts.update(device=torch.cuda.get_device_name(), capability=f"{cap[0]}.{cap[1]}",
                     cuda_arch=f"{cap[0]}{cap[1]}", device_count=torch.cuda.device_count(),
                     memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30,
                                      1))
        facts["cudnn"] = torch.backends.cudnn.version()
    from benchmarks.common import device_slug
    facts["device_slug"] = device_slug()
    if not facts["cuda_available"]:
        facts["device"] = f"no CUDA device ({facts['device_slug']})"
    facts["serving_stack"] = all(_importable(n) for n in ("fastapi", "pydantic", "uvicorn",
                                                        "fastapi_offline"))
    try:
        import onnxruntime
        facts["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except Exception:  # noqa: BLE001 - not installed or broken: no ORT steps
        facts["onnxruntime_providers"] = []
    return facts


def junit_summary(path: Path) -> Dict:
    """Counts and the failed / skipped tests (with their first message line) of a JUnit XML."""
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    out: Dict = {"passed": 0, "failed": 0, "skipped": 0, "total": 0, "failures": [],
                 "skips": {}, "cases": {}, "slowest": []}
    times = []
    for case in cases:
        if case.get("name") is None:  # the test a timeout's SIGINT stopped: no result
            continue
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        times.append((round(float(case.get("time") or 0), 2), case.get("name")))
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        out["total"] += 1
        if bad is not None:
            out["failed"] += 1
            first = (bad.get("message") or "").splitlines()[:1]
            out["failures"].append(f"{name}: {first[0] if first else ''}")
            out["cases"][case.get("name")] = "failed"
        elif skip is not None:
            out["skipped"] += 1
            reason = (skip.get("message") or "").strip()
            out["skips"][reason] = out["skips"].get(reason, 0) + 1
            out["cases"][case.get("name")] = "skipped"
        else:
            out["passed"] += 1
            out["cases"][case.get("name")] = "passed"
    out["slowest"] = [[name, t] for t, name in sorted(times, key=lambda x: -x[0])[:SLOWEST]]
    return out


def new_report() -> Dict:
    return {"steps": {}, "runs": []}


def load_report(path: Path) -> Optional[Dict]:
    """A gpu_check.json, or None when absent or unreadable."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("steps"), dict) else None


def finished(result: Dict) -> bool:
    """Whether a step result is final, so a resumed call does not run it again: it ran (it has
    seconds), not in a dry run, and ended (passed, failed, all its tests skipped, or timed out
    twice: a first timeout is tried once more, with the JIT caches then warm). Skips before
    running (budget, a missing need) and steps a killed call left "running" are not final:
    the next call tries them."""
    status = result.get("status")
    return (not result.get("dry_run") and "seconds" in result
            and (status in ("passed", "failed", "skipped")
                 or (status == "timeout" and result.get("tries", 1) >= 2)))


def run_record(facts: Dict, phases: Sequence[str], dry: bool, seconds: float) -> Dict:
    return {"date": facts["date"], "phases": list(phases), "dry_run": dry,
            "seconds": round(seconds, 1), "load_avg": facts["load_avg"]}


def save_report(folder: Path, doc: Dict) -> List[Path]:
    """Write gpu_check.json and render gpu_check.md (after every step: a call killed from
    outside leaves the steps it finished)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpu_check.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    md_path = folder / "gpu_check.md"
    md_path.write_text(markdown(doc))
    return [path, md_path]


def write_report(folder: Path, facts: Dict, results: Dict[str, Dict], phases: Sequence[str],
                 dry: bool, seconds: float) -> List[Path]:
    """Merge one run into gpu_check.json in ``folder`` (steps of earlier calls kept unless
    rerun; another device's report is replaced) and render gpu_check.md."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = load_report(folder / "gpu_check.json") or new_report()
    if doc.get("device_slug") not in (None, facts["device_slug"]):
        doc = new_report()  # another machine's report: start afresh
    doc.update(device_slug=facts["device_slug"], env=facts)
    doc["steps"].update(results)
    doc["runs"].append(run_record(facts, phases, dry, seconds))
    return save_report(folder, doc)


def markdown(doc: Dict) -> str:
    """The human-readable report: versions, one row per step, failures, probe cases."""
    env = doc["env"]
    v = env.get("versions", {})
    lines = [f"# gpu-check: {env.get('device')}", "",
             f"- device: {env.get('device')} (capability {env.get('capability', '-')}, "
             f"{env.get('memory_gib', '-')} GiB); nvidia-smi: {env.get('nvidia_smi')}",
             f"- driver {env.get('driver') or '-'}; torch {v.get('torch', '-')} (CUDA "
             f"{env.get('torch_cuda') or '-'}, cuDNN {env.get('cudnn') or '-'}); triton "
             f"{v.get('triton', '-')}; {env.get('nvcc')}",
             f"- python {env.get('python')}; serving stack: "
             f"{'yes' if env.get('serving_stack') else 'no'}; onnxruntime "
             f"{v.get('onnxruntime-gpu') or v.get('onnxruntime', '-')} providers "
             f"{', '.join(env.get('onnxruntime_providers', [])) or '-'}",
             "- runs: " + "; ".join(f"{'dry run' if r['dry_run'] else 'call'} "
                                    f"{'' if r['dry_run'] else r.get('call', i + 1)}: "
                                    f"{r['date']} {'+'.join(r['phases'])} {r['seconds']} s, "
                                    f"load {r['load_avg']}" for i, r in enumerate(doc["runs"])),
             f"- code fingerprint {doc.get('fingerprint', '-')} (a call resumes this report "
             "only with the same code; `--fresh` starts over)",
             "", "| step | status | seconds | timeout s | call | tests | note |",
             "|---|---|---|---|---|---|---|"]
    for key, r in doc["steps"].items():
        t = r.get("tests")
        tests = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped" \
            if t and t["total"] else ""
        if "collected" in r:
            tests = f"{r['collected']} collected, {r['collect_errors']} errors"
        call = "dry run" if r.get("dry_run") else r.get("call", "")
        lines.append(f"| {key} | {r['status']} | {r.get('seconds', '')} | "
                     f"{r.get('plan_timeout_s', r.get('timeout_s', ''))} | {call} | "
                     f"{tests} | {r.get('reason', '')} |")
    slow = [(key, r["tests"]["slowest"]) for key, r in doc["steps"].items()
            if (r.get("tests") or {}).get("slowest")]
    if slow:
        lines += ["", "## Where the time went (slowest tests per step)", ""]
        lines += [f"- {key}: " + ", ".join(f"`{name}` {t} s" for name, t in tests)
                  for key, tests in slow]
    for key, r in doc["steps"].items():
        t = r.get("tests") or {}
        if t.get("failures") or r["status"] in ("failed", "timeout"):
            lines += ["", f"## {key}: {r['status']}", ""]
            lines += [f"- {f}" for f in t.get("failures", [])]
            lines += ["", "```", r.get("tail", "")[-1500:], "```"]
        if t.get("skips"):
            lines += ["", f"{key} skipped: " + "; ".join(f"{n} x {why}" for why, n in
                                                         t["skips"].items())]
    variants = {name: state for key in ("correct/variants", "rest/variants")
                for name, state in ((doc["steps"].get(key, {}).get("tests") or {})
                                    .get("cases") or {}).items()}
    if variants:
        lines += ["", "## Triton variants", "", " ".join(
            f"`{name.split('[')[-1].rstrip(']')}` {state}" for name, state in variants.items())]
    return "\n".join(lines) + "\n"
