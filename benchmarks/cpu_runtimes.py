"""ONNX Runtime and OpenVINO side by side on CPU: DeiT-S plain / iRPE-K / iRPE-QKV, fp32 / bf16 /
int8, each runtime in its own process, the processes alternated.

    python -m benchmarks.cpu_runtimes [--batch 8] [--threads 2] [--rounds 5] [--processes 3]
                                      [--samples 64] [--quick] [--out DIR]

Files: the three models exported once (random weights, iRPE tables ~ N(0, 0.02), as in
benchmarks.export_ort); ONNX Runtime int8 by ``irpe quantize --activations uint8`` (its fastest
x86 kernels), OpenVINO int8 by ``irpe quantize --target openvino`` (NNCF), both calibrated on
the shapes set. Rows: ORT fp32 stock, ORT fp32 and int8 with the iRPE custom-op library where it
is built (``make ort-ops``), OpenVINO fp32 / bf16 (where the CPU has BF16) / int8 with the
iRPE nodes converted to OpenVINO's ops, and the iRPE models again with the iRPE OpenVINO
library built (``_lib`` rows, where ``make ov-ops`` built it or ``$IRPE_OV_OPS_LIBRARY`` names
it: the default mode auto, the library where it wins; int8 from an IR quantised that way);
goals are judged on the ``_lib`` rows where there are. Two
runtimes in one process compete for the cores, so each worker process holds one runtime's
sessions and times them round-robin; the parent runs ORT, OpenVINO, ORT, ... ``--processes``
times each and takes the median of every row over all rounds. Ratios: to ORT plain fp32 stock,
and to the same runtime and precision's plain model; the goals of issue 40 are judged on them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

RUNTIMES = ("onnxruntime", "openvino")
MODELS = ("plain", "irpe_k", "irpe_qkv")
# (row, reference row, goal): img/s(row) / img/s(reference) >= goal
DETR_GOALS = [("ov_detr_irpe_k_fp32", "ort_detr_irpe_k_fp32", 1.0)]  # faster, same outputs
GOALS = [("ov_irpe_k_fp32", "ov_plain_fp32", 0.97), ("ov_irpe_qkv_fp32", "ov_plain_fp32", 0.92),
         ("ov_irpe_k_int8", "ov_plain_int8", 0.92), ("ov_irpe_qkv_int8", "ov_plain_int8", 0.85),
         ("ov_irpe_k_int8", "ort_plain_fp32", 3.4), ("ov_irpe_k_bf16", "ov_plain_bf16", 0.92)]


def prepare(folder: Path, quick: bool, samples: int) -> Dict[str, Dict[str, str]]:
    """Export and quantise every file once into ``folder``; returns {runtime: {row: path}}."""
    from benchmarks.deit_forward import MODELS as NAMES
    from benchmarks.export_ort import QUICK_OVERRIDES, export_models
    names = {k: NAMES[k] for k in MODELS}
    folder.mkdir(parents=True, exist_ok=True)
    missing = {k: v for k, v in names.items() if not (folder / f"{k}.onnx").is_file()}
    export_models(missing, folder, QUICK_OVERRIDES if quick else {})  # reused when there
    fp32 = {k: folder / f"{k}.onnx" for k in names}
    ort: Dict[str, str] = {}
    ov: Dict[str, str] = {}
    library = _ov_library()
    for key, path in fp32.items():
        ort[f"ort_{key}_fp32"] = str(path)
        ov[f"ov_{key}_fp32"] = ov[f"ov_{key}_bf16"] = str(path)
        q_ort, q_ov = folder / f"{key}.int8.onnx", folder / f"{key}.int8.xml"
        _quantize(path, q_ort, ["--activations", "uint8"], samples)
        _quantize(path, q_ov, ["--target", "openvino"], samples, {"IRPE_OV_OPS": "off"})
        ort[f"ort_{key}_int8"], ov[f"ov_{key}_int8"] = str(q_ort), str(q_ov)
        if library and key != "plain":  # (no iRPE terms: the library leaves it to OpenVINO)
            q_lib = folder / f"{key}.lib.int8.xml"
            _quantize(path, q_lib, ["--target", "openvino"], samples,
                      {"IRPE_OV_OPS": "on", "IRPE_OV_OPS_LIBRARY": library})
            ov[f"ov_{key}_fp32_lib"] = ov[f"ov_{key}_bf16_lib"] = str(path)
            ov[f"ov_{key}_int8_lib"] = str(q_lib)
    return {"onnxruntime": ort, "openvino": ov}


def _ov_library() -> Optional[str]:
    """The iRPE OpenVINO library the ``_lib`` rows run (its mode and file from the
    environment), or None where it is not built or does not load."""
    from irpe.runtime.openvino.library import resolve_library
    from irpe.runtime.openvino.session import OvOptions
    options = OvOptions.from_env()
    return resolve_library("auto" if options.ops == "on" else options.ops, options.library)[0]


def _quantize(source: Path, target: Path, extra: List[str], samples: int,
              env: Optional[Dict[str, str]] = None) -> None:
    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        return  # made from this export before
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "irpe", "quantize", str(source), "-o", str(target),
                    "--calibration", "shapes", "--samples", str(samples), *extra],
                   check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
    print(f"  quantised {target.name} in {time.perf_counter() - start:.1f} s", flush=True)


DETR_MODEL, DETR_SIZE = "detr_resnet50_irpe", (800, 1216)  # --detr: one DETR-R50 iRPE-K image


def _feeds(batch: int, detr: bool) -> Dict[str, np.ndarray]:
    """One random batch: DeiT 224 images, or one unpadded DETR image with its size."""
    rng = np.random.default_rng(0)
    if not detr:
        return {"images": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}
    return {"images": rng.standard_normal((1, 3, *DETR_SIZE), dtype=np.float32),
            "sizes": np.array([DETR_SIZE], dtype=np.int64)}


def prepare_detr(folder: Path) -> Dict[str, Dict[str, str]]:
    """DETR-R50 iRPE-K exported once (random weights): fp32 on both runtimes."""
    from benchmarks.export_ort import export_models
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "detr_irpe_k.onnx"
    if not path.is_file():
        export_models({"detr_irpe_k": DETR_MODEL}, folder, {})
    return {"onnxruntime": {"ort_detr_irpe_k_fp32": str(path)},
            "openvino": {"ov_detr_irpe_k_fp32": str(path)}}


def _ort_runs(files: Dict[str, str], threads: int, x: Dict[str, np.ndarray]
              ) -> Dict[str, object]:
    from irpe.runtime.onnxruntime.session import OrtOptions, find_library
    from irpe.runtime.pick import open_file
    runs = {}
    library = find_library(OrtOptions().library)
    for row, path in files.items():
        modes = ["off", "on"] if library else ["off"]
        if row.endswith("_int8"):
            modes = modes[-1:]  # int8: the best path only
        for mode in modes:
            label = row if mode == "off" or row.endswith("_int8") else row + "_lib"
            file = open_file(path, "onnxruntime", ort=OrtOptions(custom_ops=mode),
                             threads=threads, quiet=True)
            runs[label] = (lambda f=file: list(f.run(x).values()))
    return runs


def _ov_runs(files: Dict[str, str], threads: int, x: Dict[str, np.ndarray]
             ) -> Dict[str, object]:
    from irpe.runtime.openvino.core import cpu_capabilities
    from irpe.runtime.openvino.session import OvOptions
    from irpe.runtime.pick import open_file
    has_bf16 = "BF16" in cpu_capabilities()
    library = _ov_library()
    runs = {}
    for row, path in files.items():
        if "_bf16" in row and not has_bf16:
            continue
        lib = row.endswith("_lib")
        # _lib: the default path with the library built (auto: the library where it wins)
        options = OvOptions("bf16" if "_bf16" in row else "fp32", threads, 1, "latency",
                            ops="auto" if lib else "off", library=(library or "") if lib else "")
        file = open_file(path, "openvino", ov=options,
                         shapes={name: value.shape for name, value in x.items()})
        runs[row] = (lambda f=file: list(f.run(x).values()))
    return runs


def worker(runtime: str, files: Dict[str, str], batch: int, threads: int, rounds: int,
           warmup: int, detr: bool = False, outputs: Optional[Path] = None
           ) -> Dict[str, List[float]]:
    """Seconds per run of every row, ``rounds`` round-robin rounds after ``warmup``; with
    ``outputs``, each row's first outputs saved there (rows compared across runtimes)."""
    x = _feeds(batch, detr)
    runs = (_ort_runs if runtime == "onnxruntime" else _ov_runs)(files, threads, x)
    if outputs is not None:
        for row, run in runs.items():
            flat = np.concatenate([np.asarray(o).ravel() for o in run()])  # type: ignore
            np.save(outputs / f"{row}.npy", flat)
    times: Dict[str, List[float]] = {row: [] for row in runs}
    for round_ in range(warmup + rounds):
        for row, run in runs.items():
            start = time.perf_counter()
            run()  # type: ignore[operator]
            if round_ >= warmup:
                times[row].append(time.perf_counter() - start)
    return times


def alternate(files: Dict[str, Dict[str, str]], args: argparse.Namespace,
              outputs: Optional[Path] = None) -> Dict[str, List[float]]:
    """Run the workers ORT, OpenVINO, ORT, ... and merge their rounds per row; the first
    process of each runtime saves its rows' outputs in ``outputs``."""
    merged: Dict[str, List[float]] = {}
    for n in range(args.processes):
        for runtime in RUNTIMES:
            cmd = [sys.executable, "-m", "benchmarks.cpu_runtimes", "--worker", runtime,
                   "--files", json.dumps(files[runtime]), "--batch", str(args.batch),
                   "--threads", str(args.threads), "--rounds", str(args.rounds),
                   "--warmup", str(args.warmup)] + (["--detr"] if args.detr else [])
            if outputs is not None and n == 0:
                cmd += ["--outputs", str(outputs)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            for row, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
                merged.setdefault(row, []).extend(seconds)
            print(f"  process {n + 1}/{args.processes} {runtime}: done", flush=True)
    return merged


def summarize(times: Dict[str, List[float]], batch: int) -> Dict[str, Dict]:
    """img/s per row, x ORT plain fp32 stock, x the same runtime/precision's plain row."""
    med = {row: statistics.median(v) for row, v in times.items()}
    base = med.get("ort_plain_fp32")
    rows = {}
    for row, seconds in med.items():
        plain = _plain_of(row)
        if plain not in med and row.endswith("_lib"):  # OpenVINO: plain runs as it is
            plain = plain[:-len("_lib")]
        rows[row] = {"median_ms": 1000 * seconds, "images_per_s": batch / seconds,
                     "x_ort_plain_fp32": base / seconds if base else None,
                     "x_same_plain": med[plain] / seconds if plain in med else None}
    return rows


def _plain_of(row: str) -> str:
    for model in MODELS[1:]:
        row = row.replace(f"_{model}_", "_plain_")
    return row


def output_gap(outputs: Path) -> Dict[str, float]:
    """Max |OpenVINO - ONNX Runtime| over the outputs of each model both ran (fp32 rows)."""
    gaps = {}
    for ov_file in sorted(outputs.glob("ov_*_fp32*.npy")):
        ort_file = outputs / ov_file.name.replace("ov_", "ort_", 1).replace("_lib.npy", ".npy")
        if ort_file.is_file():
            gap = np.abs(np.load(ov_file) - np.load(ort_file)).max()
            gaps[ov_file.stem.replace("ov_", "", 1)] = float(gap)
    return gaps


def goals(rows: Dict[str, Dict], table: List = GOALS) -> List[Dict]:
    """Each goal of ``table``, judged on the row's ``_lib`` form where it ran (the iRPE
    OpenVINO library: the default path where built); rows that could not run listed as such."""
    out = []
    for row, ref, goal in table:
        row = row + "_lib" if row.startswith("ov_") and row + "_lib" in rows else row
        if row not in rows or ref not in rows:
            out.append({"row": row, "reference": ref, "goal": goal, "ratio": None, "met": None})
            continue
        ratio = rows[row]["images_per_s"] / rows[ref]["images_per_s"]
        out.append({"row": row, "reference": ref, "goal": goal, "ratio": ratio,
                    "met": ratio >= goal})
    return out


def report_lines(result: Dict) -> List[str]:
    """The markdown report."""
    lines = [f"# ONNX Runtime vs OpenVINO on {result['device']} ({result['date']})", "",
             f"{result['model']} batch {result['batch']}, {result['threads']} threads, "
             f"{result['processes']} processes per runtime alternated x {result['rounds']} "
             f"rounds (medians); onnxruntime {result['onnxruntime']}, openvino "
             f"{result['openvino']}; int8: ORT uint8 activations, OpenVINO NNCF "
             f"({result['samples']} shapes images); load {result['load']}.", "",
             "| row | median ms | img/s | x ORT plain fp32 | x same runtime plain |",
             "|---|---|---|---|---|"]
    for row, r in result["results"].items():
        same = "" if r["x_same_plain"] is None else f"{r['x_same_plain']:.3f}"
        base = "" if r["x_ort_plain_fp32"] is None else f"{r['x_ort_plain_fp32']:.2f}"
        lines.append(f"| {row} | {r['median_ms']:.1f} | {r['images_per_s']:.1f} | "
                     f"{base} | {same} |")
    lines += ["", "| goal | ratio | verdict |", "|---|---|---|"]
    for g in result["goals"]:
        ratio = "could not run" if g["ratio"] is None else f"{g['ratio']:.3f}"
        verdict = "-" if g["met"] is None else ("met" if g["met"] else "missed")
        lines.append(f"| {g['row']} / {g['reference']} >= {g['goal']} | {ratio} | {verdict} |")
    if result.get("output_gap"):
        lines += ["", "| model (fp32) | max abs OpenVINO - ONNX Runtime, same input |",
                  "|---|---|"]
        lines += [f"| {k} | {v:.3g} |" for k, v in result["output_gap"].items()]
    return lines


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option, default in (("batch", 8), ("threads", 2), ("rounds", 5), ("warmup", 2),
                            ("processes", 3), ("samples", 64)):
        parser.add_argument(f"--{option}", type=int, default=default)
    parser.add_argument("--quick", action="store_true",
                        help="2-block DeiT-S, batch 1, 1 round, 1 process: checks the report")
    parser.add_argument("--cache", type=Path, default=Path("build/bench-cpu-runtimes"),
                        help="folder for the exported and quantised files (reused; delete it "
                             "to export again)")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--detr", action="store_true",
                        help=f"{DETR_MODEL} fp32 at {DETR_SIZE[0]}x{DETR_SIZE[1]}, batch 1, "
                             "instead of the DeiT-S rows")
    parser.add_argument("--worker", choices=RUNTIMES, help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    parser.add_argument("--outputs", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.batch, args.threads, args.rounds, args.processes, args.samples) < 1 \
            or args.warmup < 0:
        parser.error("--batch, --threads, --rounds, --processes, --samples must be >= 1")
    if args.quick:
        args.batch, args.rounds, args.warmup, args.processes, args.samples = 1, 1, 1, 1, 2
    return args


def main(argv: Optional[List[str]] = None) -> int:

    from benchmarks.common import device_name
    from benchmarks.report import write_json_md
    args = _parse(argv)
    if args.worker:
        files = json.loads(args.files)
        print(json.dumps(worker(args.worker, files, args.batch, args.threads, args.rounds,
                                args.warmup, args.detr, args.outputs)))
        return 0

    import onnxruntime
    import openvino
    if args.detr:
        args.batch, files = 1, prepare_detr(args.cache / "detr")
    else:
        cache = args.cache / ("quick" if args.quick else "deit_s")
        files = prepare(cache, args.quick, args.samples)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        times = alternate(files, args, Path(tmp))
        gap = output_gap(Path(tmp))
    rows = summarize(times, args.batch)
    result = {"device": device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "batch": args.batch, "threads": args.threads, "rounds": args.rounds,
              "processes": args.processes, "samples": args.samples, "quick": args.quick,
              "onnxruntime": onnxruntime.__version__, "openvino": openvino.__version__,
              "load": " ".join(f"{v:.2f}" for v in load), "results": rows,
              "goals": goals(rows, DETR_GOALS if args.detr else GOALS), "output_gap": gap,
              "model": f"{DETR_MODEL} {DETR_SIZE[0]}x{DETR_SIZE[1]}" if args.detr else "DeiT-S 224"}
    out_dir = args.out or Path(__file__).parent / "results" / result["device"]
    stem = "cpu_runtimes" + ("_detr" if args.detr else "") + ("_quick" if args.quick else "")
    print(write_json_md(out_dir, stem, result, report_lines(result)).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
