"""Two ONNX Runtime models in one process, called in turn (a server with mixed traffic):
per-call latency with ONE shared intra-op pool vs a pool per model.

    python -m benchmarks.ort_pools [--threads 2] [--repeats 50] [--quick]

Each mode runs in a child process of its own, because ONNX Runtime's global pool is
process-wide. Both use the demo models' ONNX files (serve.demo; exported into the cache when
missing). For each model the child prints the median ms of a call alone (50 calls in a row)
and in turn with the other model, and mixed / alone. With a pool per model, the other model's
idle workers are still spinning when a call starts (serve's ``ort_thread_pool``,
docs/serve.md). Writes benchmarks/results/<device>/ort_pools.{json,md}.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np

from benchmarks.common import device_name
from benchmarks.ops_common import time_round_robin
from benchmarks.report import write_json_md

MODES = ("shared", "per_model")


def _feeds(session, task: str) -> Dict[str, np.ndarray]:
    """One image (classification: the file's static size; detection: 128 x 128 + its size)."""
    rng = np.random.default_rng(0)
    if task == "detection":
        return {"images": rng.standard_normal((1, 3, 128, 128), dtype=np.float32),
                "sizes": np.array([[128, 128]], np.int64)}
    shape = [d if isinstance(d, int) else 1 for d in session.get_inputs()[0].shape]
    return {"images": rng.standard_normal(shape, dtype=np.float32)}


def child(mode: str, paths: List[str], threads: int, repeats: int) -> Dict:
    """Median ms per call of each model alone and in turn, in this process's ``mode``."""
    from irpe.runtime.onnxruntime.session import share_thread_pool
    from irpe.runtime.pick import open_file
    if mode == "shared" and not share_thread_pool(threads):
        raise RuntimeError("could not make the shared pool")
    runs = {}
    for path in paths:
        file = open_file(path, "onnxruntime", threads=threads, quiet=True)
        feeds = _feeds(file.session, file.spec.task)  # type: ignore[attr-defined]
        runs[Path(path).stem.rsplit("-", 1)[0]] = functools.partial(file.run, feeds)
    alone = {name: time_round_robin({name: run}, repeats, 3)[name] for name, run in runs.items()}
    mixed = time_round_robin(runs, repeats, 3)  # the models in turn, round after round
    return {name: {"alone_ms": 1e3 * statistics.median(alone[name]),
                   "mixed_ms": 1e3 * statistics.median(mixed[name])} for name in runs}


def _report(result: Dict, out_dir: Path) -> Path:
    lines = [f"# Two ONNX Runtime models called in turn, on {result['device']}", "",
             f"{result['threads']} threads, {result['repeats']} calls per median, onnxruntime "
             f"{result['onnxruntime']}.", "",
             "| pools | model | alone ms | in turn ms | in turn / alone |", "|---|---|---|---|---|"]
    for mode in MODES:
        for model, row in result["modes"][mode].items():
            lines.append(f"| {mode} | {model} | {row['alone_ms']:.2f} | {row['mixed_ms']:.2f} "
                         f"| {row['mixed_ms'] / row['alone_ms']:.2f} |")
    lines += ["", "In turn, a pool per model / one shared pool: " + ", ".join(
        f"{m} {result['modes']['per_model'][m]['mixed_ms'] / row['mixed_ms']:.2f}x"
        for m, row in result["modes"]["shared"].items())]
    return write_json_md(out_dir, "ort_pools", result, lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5 calls: checks the report")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--files", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if args.child:
        print(json.dumps(child(args.child, args.files, args.threads, args.repeats)))
        return 0
    import onnxruntime

    from serve.demo import demo_models
    repeats = 5 if args.quick else args.repeats
    files = [str(c.path) for c in demo_models("onnxruntime")]
    modes = {}
    for mode in MODES:
        done = subprocess.run([sys.executable, "-m", "benchmarks.ort_pools", "--child", mode,
                               "--threads", str(args.threads), "--repeats", str(repeats),
                               "--files", *files], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1])
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"benchmarks.ort_pools: the {mode} process failed: {last}")
        modes[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    result = {"device": device_name(), "onnxruntime": onnxruntime.__version__,
              "threads": args.threads, "repeats": repeats, "quick": args.quick, "modes": modes}
    out_dir = args.out or Path(__file__).parent / "results" / result["device"]
    print(_report(result, out_dir).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
