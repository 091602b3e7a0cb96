"""``irpe tune`` end to end: the model resolved, the space built for this CPU, the search run
with the real measurement and accuracy gate, the tuned file served once in a fresh process
(its Triton configuration read back, optionally re-measured), then every output written
together (irpe.outputs.check_outputs before any work, irpe.atomic for the files)."""
from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .accuracy import AccuracyGate, ModelFiles
from .goal import Goal
from .measure import ServeMeasure, repository, write_yaml
from .options import Options
from .report import pbtxt_text, plot, table
from .search import Budget, Outcome, search
from .space import PRECISIONS, Candidate, axes, cpu_flags, default_candidate, precisions_for
from .store import ResultStore
from .target import Target, backends_for, resolve

__all__ = ["tune"]

START_S = 8.0  # a server start, before one was timed (then the longest seen is used)


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:16]


def _context(target: Target, goal: Goal, options: Options, machine: str) -> str:
    """What a measurement depends on besides its candidate: the machine, the model files, the
    loads and the warm-up (a changed one measures afresh)."""
    files = ",".join(f"{k}={_digest(p)}" for k, p in sorted(target.files.items()))
    return f"{machine}|{os.cpu_count()}|{files}|{goal.loads()}|{options.warmup_s}"


def _precisions(options: Options, target: Target, val: Optional[str], notes: List[str]
                ) -> List[str]:
    wanted = options.precisions or list(PRECISIONS)
    have = precisions_for(cpu_flags(), wanted)
    for p in wanted:
        if p not in have:
            notes.append(f"{p}: not tried, this CPU lacks it (bf16: AVX512_BF16/AMX, int8: VNNI)")
    if not val and have != ["fp32"]:
        notes.append("int8 / bf16: not tried, no --val-data for the accuracy gate")
        return ["fp32"]
    if "int8" in have and "onnx" not in target.files:
        notes.append("int8: not tried, irpe quantize needs the model's .onnx file")
        have.remove("int8")
    return have


def _calibration(val: Optional[str], notes: List[str]) -> str:
    """int8's calibration images: shapes' training split for shapes (the gate scores its
    validation split), a folder's train/ where it has one, else the folder itself (noted: the
    gate then scores images the quantiser saw)."""
    if not val or val == "shapes":
        return "shapes"
    train = Path(val) / "train"
    if train.is_dir():
        return str(train)
    notes.append(f"int8 calibrated on {val} itself (no {train}): the gate scores images the "
                 "quantiser saw")
    return val


def tune(options: Options, spec: str, repo_model: Optional[str]) -> int:
    """Run ``irpe tune``; 0 with the outputs written, 1 when nothing could be measured."""
    from benchmarks.common import device_name
    from benchmarks.plots import device_title
    from irpe.outputs import check_outputs
    from irpe.weights import cache_dir
    work = options.workdir()
    results = work / "results.jsonl"
    given = [Path(spec)] if Path(spec).exists() else []
    check_outputs([*options.siblings(), results], [*given, options.val_data])
    target = resolve(spec, repo_model, cache_dir() / "tune")
    check_outputs([*options.siblings(), results], [*target.inputs, options.val_data])
    goal = Goal(options.clients, options.p99_ms, options.rate)
    notes: List[str] = []
    val = options.val_data or ("shapes" if target.demo else None)
    backends = backends_for(target, options.backends)
    precisions = _precisions(options, target, val, notes)
    start = default_candidate(backends[0])
    space = {a.name: a for a in axes(backends, precisions)}
    machine = device_name()
    store = ResultStore(results, _context(target, goal, options, machine))
    files = ModelFiles(target, work, calibration=_calibration(val, notes))
    gate = AccuracyGate(files, val or "shapes", options.margin, options.val_images)
    measure = ServeMeasure(target, files, goal, work, options.warmup_s)
    loads = len(goal.loads())
    print(f"irpe tune {target.name}: {goal.describe()}; budget {options.budget_min:g} min; "
          f"backends {', '.join(backends)}; precisions {', '.join(precisions)}; results "
          f"{results}", flush=True)
    outcome = search(start, [space[a] for a in options.axes], measure, goal, store,
                     Budget(options.budget_min * 60), gate, keep=options.keep,
                     final=options.final, short_s=options.short_s, full_s=options.full_s,
                     estimate=lambda s: loads * (s + options.warmup_s) + START_S,
                     log=lambda line: print(line, flush=True),
                     gate_id=f"{val}|{options.margin}|{options.val_images}")
    outcome.notes[:0] = notes
    if outcome.best is None:
        print(f"irpe tune: nothing was measured within {options.budget_min:g} min (one "
              "measurement takes a server start and its loads): raise --budget-min",
              file=sys.stderr)
        return 1
    title = (f"irpe tune {target.name}: {goal.describe()}\n{device_title(machine)}  ·  "
             f"{time.strftime('%Y-%m-%d %H:%M')}")
    _finish(options, target, goal, outcome, files, title, val)
    return 0


def _served(options: Options, target: Target, cand: Candidate, files: ModelFiles,
            goal: Goal) -> Tuple[Dict[str, Any], Dict[str, Any], Optional[Dict[str, Any]]]:
    """The tuned repository (dict) served from a staged copy in a fresh process: its Triton
    configuration as the server answers it and, with --remeasure, its loads again."""
    import httpx

    from benchmarks.serve_load import server_process
    data = repository(target, cand, files.path(cand))
    staged = options.workdir() / "tuned-check.yaml"
    write_yaml(staged, data)
    again = None
    with server_process(staged, cand.threads) as base:
        config = httpx.get(f"{base}/v2/models/{target.name}/config", timeout=60).json()
        if options.remeasure:
            again = ServeMeasure(target, files, goal, options.workdir(),
                                 options.warmup_s).loads(base, options.full_s)
    return data, config, again


def _finish(options: Options, target: Target, goal: Goal, outcome: Outcome,
            files: ModelFiles, title: str, val: Optional[str]) -> None:
    from irpe.atomic import atomic_files
    assert outcome.best is not None
    cand: Candidate = outcome.best["candidate"]
    data, config, again = _served(options, target, cand, files, goal)
    best_row = goal.main_row(outcome.best[outcome.best["stage"]])
    lines = [f"# irpe tune {target.name}", "", title.replace("\n", "  ·  "), "",
             f"- tuned: `{cand.label()}` ({outcome.best['stage']} run): "
             f"{best_row['images_per_s']:.1f} img/s, p50 {best_row['p50_ms']:.1f} ms, "
             f"p99 {best_row['p99_ms']:.1f} ms",
             *_versus_default(outcome, goal), *_remeasured(again, best_row, goal),
             _gate_line(outcome, val, options.margin),
             f"- serve it: `irpe serve {options.output}`"]
    import importlib.util

    import yaml
    paths = options.siblings()
    drawn = importlib.util.find_spec("matplotlib") is not None
    if not drawn:
        print("irpe tune: matplotlib is not installed (the bench extra): no plot",
              file=sys.stderr)
    written = [paths[1], paths[3], *paths[2:3] * drawn, paths[0]]  # the YAML last
    with atomic_files(written) as temps:
        md, pbtxt, out = temps[0], temps[1], temps[-1]
        out.write_text(yaml.safe_dump(data, sort_keys=False))
        md.write_text(table(outcome, goal, lines), encoding="utf-8")
        pbtxt.write_text(pbtxt_text(config))
        if drawn:
            plot(outcome, goal, title, temps[2])
    for line in lines[4:]:
        print(line.removeprefix("- "))
    print(f"wrote {', '.join(str(p) for p in written)}")


def _gate_line(outcome: Outcome, val: Optional[str], margin: float) -> str:
    reduced = sorted({c.precision for c, e in outcome.entries.items()
                      if c.precision != "fp32" and e["status"] != "new"})  # checked ones
    if not reduced:
        return "- accuracy gate: not needed (fp32 only measured)"
    return f"- accuracy gate ({', '.join(reduced)}): {val}, margin {margin:g} points of fp32"


def _versus_default(outcome: Outcome, goal: Goal) -> List[str]:
    if outcome.start is None or outcome.best is None:
        return []
    stage = outcome.best["stage"]
    start = outcome.entries.get(outcome.start, {})
    if stage not in start:
        return [f"- default `{outcome.start.label()}`: not measured at {stage} length"]
    row, best = goal.main_row(start[stage]), goal.main_row(outcome.best[stage])
    key = "p99_ms" if goal.rate else "images_per_s"  # what the goal optimises
    ratio = best[key] / row[key] if row.get(key) else 0.0
    return [f"- default `{outcome.start.label()}`: {row['images_per_s']:.1f} img/s, p50 "
            f"{row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms; tuned/default "
            f"{'p99' if goal.rate else 'throughput'} x{ratio:.2f}"]


def _remeasured(again: Optional[Dict[str, Any]], best_row: Dict[str, Any], goal: Goal
                ) -> List[str]:
    if not again:
        return []
    row = goal.main_row(again)
    ratio = row["images_per_s"] / best_row["images_per_s"] if best_row["images_per_s"] else 0
    return [f"- re-measured in a fresh process: {row['images_per_s']:.1f} img/s, p50 "
            f"{row.get('p50_ms', float('nan')):.1f} ms, p99 {row.get('p99_ms', float('nan')):.1f}"
            f" ms (x{ratio:.2f} of the search's figure)"]
