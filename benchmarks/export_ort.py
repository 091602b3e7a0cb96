"""ONNX Runtime throughput of exported DeiT-S iRPE-K / iRPE-QKV relative to exported plain DeiT-S.

    python -m benchmarks.export_ort [--batch 8] [--threads 2] [--repeats 7] [--sessions 2]
                                    [--quick] [--no-custom-ops] [--own-pools]

Each model is exported with ``export.onnx.export_onnx`` (RPE nodes + local functions, random
weights, non-zero iRPE tables), loaded into ``--sessions`` CPU sessions of its own, warmed up and
then timed round-robin (one run of each session per round; a row's round time is the mean of its
sessions) so machine drift hits all alike and no row hangs on one session's memory placement.
All sessions share ONE intra-op thread pool
(``irpe.runtime.onnxruntime.session.share_thread_pool``): with a pool each, the idle workers of
the session that ran last spin on the cores for tens of ms and slow the next one, which skewed
the ratios by several hundredths (docs/export.md; ``--own-pools`` times it that way). Where the
custom-op library (plugins/onnxruntime) is built, each iRPE file also gets a second session with
it registered (rows ``*_ops``), timed in the same rounds with the same threads. Reports the
median / p90 per run, images/s and the throughput ratio to the plain model against the goals
(functions: iRPE-K >= 0.95, iRPE-QKV >= 0.90; custom ops: >= 0.98, >= 0.95), judged on the
median times; on shared machines also see the median of the per-round ratios and the ratio of
the best times, which load spikes disturb less. The same run
times the RPE function bodies against the alternatives they were chosen over and the custom
ops, on one DeiT-S layer (``LAYER``), and block 0's attention cut out of the exported plain and
iRPE-QKV files (``BLOCK_IO``): stock, as one RPEAttention, and (iRPE) the fused ops without
it. Writes JSON + Markdown under benchmarks/results/<device>/.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from benchmarks import deit_forward
from benchmarks.common import device_name
from benchmarks.deit_forward import MODELS
from benchmarks.report import write_json_md
from irpe.artifact.contract import DEFAULT_OPSET
from irpe.runtime.onnxruntime.session import (
    OrtOptions,
    create_session,
    find_library,
    share_thread_pool,
)
from irpe.runtime.pick import open_file

GOALS = {"irpe_k": 0.95, "irpe_qkv": 0.90, "irpe_k_ops": 0.98, "irpe_qkv_ops": 0.95}
OPS_SUFFIX = "_ops"  # rows of the sessions with the custom-op library
QUICK_OVERRIDES = dict(depth=2)  # DeiT-Ti with 2 blocks: checks the report, not the numbers


LAYER = dict(B=8, H=6, L=197, K=50)  # DeiT-S attention at 224x224, product ratio 1.9 + cls
# Block 0's attention in an exported DeiT: the reshaped qkv projection in, the input of the
# output projection out (what the fusion stage "attention" turns into one RPEAttention)
BLOCK_IO = ("/model/blocks.0/attn/Reshape_output_0", "/model/blocks.0/attn/Transpose_2_output_0")
SESSION4_STAGES = "qlayout,gather,scatter,softmax"  # the fused ops without RPEAttention


def _graph(nodes, inputs, opset: int = DEFAULT_OPSET, functions=()):
    from onnx import TensorProto, helper
    value_infos = [helper.make_tensor_value_info(n, TensorProto.FLOAT if f else TensorProto.INT64,
                                                 None) for n, f in inputs]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(nodes, "op", value_infos, [out]),
                              opset_imports=[helper.make_opsetid("", opset),
                                             helper.make_opsetid("irpe", 1)],
                              functions=list(functions))
    model.ir_version = 8
    return model.SerializeToString()


def formulations() -> Dict[str, bytes]:
    """Gather / Q term / scatter as ONNX graphs: ours (the local functions) and alternatives."""
    from onnx import helper

    from export.functions import gather_function, scatter_function
    n = helper.make_node
    tbl, att, idx = ("table", True), ("attn", True), ("index", False)
    gather, scatter = gather_function(DEFAULT_OPSET), scatter_function(DEFAULT_OPSET)
    attrs = dict(domain="irpe", plugin_namespace="irpe", plugin_version="1",
                 num_buckets=LAYER["K"])
    return {
        "gather: rows Gather (ours)": _graph([n("RPEGather", ["table", "index"], ["out"], **attrs)],
                                             [tbl, idx], functions=[gather]),
        "gather: GatherElements + expanded index": _graph(
            [n("Expand", ["index", "out_shape"], ["big"]),
             n("GatherElements", ["table", "big"], ["out"], axis=3)],
            [tbl, idx, ("out_shape", False)]),
        "gather: flatten + Gather (official export)": _graph(
            [n("Reshape", ["table", "flat_shape"], ["flat"]),
             n("Gather", ["flat", "flat_index"], ["picked"], axis=2),
             n("Reshape", ["picked", "out_shape"], ["out"])],
            [tbl, ("flat_shape", False), ("flat_index", False), ("out_shape", False)]),
        "q term: 1-row table + transposed index (ours)": _graph(
            [n("Reshape", ["table", "row_shape"], ["row"]),
             n("RPEGather", ["row", "index_t"], ["out"],
               **dict(attrs, num_buckets=LAYER["L"] * LAYER["K"]))],
            [tbl, ("row_shape", False), ("index_t", False)], functions=[gather]),
        "q term: gather + Transpose (as traced)": _graph(
            [n("RPEGather", ["table", "index"], ["picked"], **attrs),
             n("Transpose", ["picked"], ["out"], perm=[0, 1, 3, 2])],
            [tbl, idx], functions=[gather]),
        "scatter: one-hot MatMul (ours)": _graph(
            [n("RPEScatter", ["attn", "index"], ["out"], **attrs)], [att, idx],
            functions=[scatter]),
        "scatter: ScatterElements add (not parsed by TensorRT)": _graph(
            [n("Expand", ["index", "attn_shape"], ["big"]),
             n("ScatterElements", ["zeros", "big", "attn"], ["out"], axis=3, reduction="add")],
            [att, idx, ("attn_shape", False), ("zeros", True)]),
    }


def _layer_feeds() -> Dict[str, np.ndarray]:
    """Inputs of one DeiT-S layer: tables, attention, product bucket ids with the cls bucket."""
    import irpe
    b, h, length, k = LAYER["B"], LAYER["H"], LAYER["L"], LAYER["K"]
    ids = irpe.bucket_ids("product", 1.9, 14, 14, skip=1).numpy()
    rng = np.random.default_rng(0)
    return {"table": rng.standard_normal((b, h, length, k), dtype=np.float32),
            "attn": rng.random((b, h, length, length), dtype=np.float32), "index": ids,
            "flat_index": (ids + np.arange(length)[:, None] * k).reshape(-1),
            "flat_shape": np.array([0, 0, -1]), "out_shape": np.array([b, h, length, length]),
            "row_shape": np.array([0, 0, 1, -1]),
            "index_t": (ids + np.arange(length)[:, None] * k).T.copy(),
            "attn_shape": np.array([b, h, length, length]),
            "zeros": np.zeros((b, h, length, k), np.float32),
            BLOCK_IO[0]: rng.standard_normal((b, length, 3, h, 64), dtype=np.float32)}


def attention_blocks(paths: Dict[str, Path]) -> Dict[str, bytes]:
    """Block 0's attention (BLOCK_IO) cut out of the exported plain and iRPE-QKV files, as
    formulations: the file's nodes (ours), run as they are or with the custom-op library."""
    import onnx
    from onnx.utils import Extractor
    names = {"plain": "attention block, plain", "irpe_qkv": "attention block, iRPE-QKV"}
    return {f"{names[key]}: exported nodes (ours)": Extractor(onnx.load(paths[key]))
            .extract_model([BLOCK_IO[0]], [BLOCK_IO[1]]).SerializeToString()
            for key in names if key in paths}


def _session(graph: bytes, threads: int, library: Optional[Path], stages: str = "1"):
    """A session of ``graph`` with the ``library`` (None: without), rewrite stages ``stages``."""
    return create_session(graph, threads=threads, custom_ops="on" if library else "off",
                          library=library, quiet=True, rewrites=stages)[0]


def measure_ops(threads: int, repeats: int, warmup: int, library: Optional[Path],
                blocks: Dict[str, bytes] = None) -> Dict[str, List[float]]:
    """Seconds per run of each formulation (checked equal to the first of its kind); with the
    custom-op ``library`` each of ours also as the custom op (key ``... [custom op]``), and the iRPE
    attention block also with the fused ops of session 4 (no RPEAttention)."""
    feeds = _layer_feeds()
    runs: Dict[str, Callable[[], object]] = {}
    for key, graph in dict(formulations(), **(blocks or {})).items():
        variants = [(False, "1")]
        if library and "(ours)" in key:
            variants.append((True, "1"))
        if library and key.startswith("attention block, iRPE"):
            variants.append((True, SESSION4_STAGES))
        for ops, stages in variants:
            session = _session(graph, threads, library if ops else None, stages)
            names = [i.name for i in session.get_inputs()]
            label = key if not ops else key.replace(
                "(ours)", "(custom op)" if stages == "1" else "(fused ops, no RPEAttention)")
            runs[label] = functools.partial(session.run, None, {k: feeds[k] for k in names})
    reference = {}
    for key, run in runs.items():
        kind, out = key.split(":")[0], run()[0]
        np.testing.assert_allclose(out, reference.setdefault(kind, out), rtol=1e-5, atol=1e-5)
    return round_robin({key: [run] for key, run in runs.items()}, repeats, warmup, "ops")


def export_models(models: Dict[str, str], folder: Path, overrides: Dict) -> Dict[str, Path]:
    """Export every model once (random weights, iRPE tables ~ N(0, 0.02))."""
    from export.onnx import export_onnx
    from irpe import create_model, randomize_tables
    from irpe.artifact.trained import default_spec
    paths = {}
    for key, name in models.items():
        torch.manual_seed(0)
        model = randomize_tables(create_model(name, **overrides).eval())
        start = time.perf_counter()
        paths[key] = export_onnx(model, folder / f"{key}.onnx",
                                 spec=default_spec(name, **overrides))
        print(f"  exported {key:<9} {name} in {time.perf_counter() - start:.1f} s", flush=True)
    return paths


def measure(paths: Dict[str, Path], batch: int, threads: int, repeats: int,
            warmup: int, library: Optional[Path] = None, sessions: int = 1
            ) -> Dict[str, List[float]]:
    """Seconds per session.run for each exported file, interleaved round-robin; with the
    custom-op ``library`` every file also runs with it (key + OPS_SUFFIX). With
    ``sessions`` > 1 each row gets that many sessions of its own, each run once per round, and
    the round's time is their mean: one session's memory placement does not decide the row."""
    runs, outputs, _ = session_runs(paths, batch, threads, library, sessions)
    for key in paths:  # the custom ops must give the functions' logits
        if key + OPS_SUFFIX in outputs:
            np.testing.assert_allclose(outputs[key + OPS_SUFFIX], outputs[key], rtol=1e-5,
                                       atol=1e-5)
    return round_robin(runs, repeats, warmup, "models")


def session_runs(paths: Dict[str, Path], batch: int, threads: int, library: Optional[Path],
                 sessions: int) -> Tuple[Dict[str, List[Callable[[], object]]],
                                         Dict[str, np.ndarray], Dict[str, object]]:
    """(``sessions`` run callables, first output, fusion report) per row: every file stock and,
    with the custom-op ``library``, with it (key + OPS_SUFFIX), all fed one random batch."""
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    runs: Dict[str, List[Callable[[], object]]] = {}
    outputs: Dict[str, np.ndarray] = {}
    fusion: Dict[str, object] = {}
    for key, path in paths.items():
        for ops in (False, True) if library else (False,):
            label = key + OPS_SUFFIX if ops else key
            for _ in range(sessions):
                file = open_file(path, "onnxruntime", threads=threads, quiet=True,
                                 ort=OrtOptions(custom_ops="on" if ops else "off",
                                                library=library))
                runs.setdefault(label, []).append(functools.partial(file.run, {"images": x}))
                how = file.ops  # type: ignore[attr-defined]
            fusion[label] = how
            outputs[label] = runs[label][0]()["logits"]
    return runs, outputs, fusion


def round_robin(runs: Dict[str, List[Callable[[], object]]], repeats: int, warmup: int,
                 label: str) -> Dict[str, List[float]]:
    """Per key, the mean seconds of its callables in each round; a round runs the first
    callable of every key, then the second, ... so all keys see the same machine state."""
    times: Dict[str, List[float]] = {key: [] for key in runs}
    for round_ in range(warmup + repeats):
        elapsed: Dict[str, List[float]] = {key: [] for key in runs}
        for n in range(max(len(fns) for fns in runs.values())):
            for key, fns in runs.items():
                if n < len(fns):
                    elapsed[key].append(_seconds(fns[n]))
        for key, seconds in elapsed.items():
            if round_ >= warmup:
                times[key].append(statistics.fmean(seconds))
        print(f"  {label} round {round_ + 1}/{warmup + repeats}"
              f"{' (warm-up)' if round_ < warmup else ''}", flush=True)
    return times


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def summarize(times: Dict[str, List[float]], models: Dict[str, str], batch: int) -> Dict:
    """deit_forward's rows (median, p90, img/s) plus throughput / plain and the goals."""
    models = dict(models, **{k + OPS_SUFFIX: v for k, v in models.items()})
    rows = deit_forward.summarize(times, models, batch)
    plain, plain_ops = times["plain"], times.get("plain" + OPS_SUFFIX)
    for key, row in rows.items():
        ratio = 1.0 / row.pop("ratio_to_plain")
        # same round: same machine state
        rounds = [p / t for p, t in zip(plain, times[key], strict=True)]
        row.update(throughput_ratio=ratio, goal=GOALS.get(key),
                   meets_goal=ratio >= GOALS[key] if key in GOALS else None,
                   ratio_round_median=statistics.median(rounds),
                   ratio_best=min(plain) / min(times[key]),
                   ratio_to_plain_ops=(statistics.median(plain_ops) / statistics.median(
                       times[key]) if plain_ops and key.endswith(OPS_SUFFIX) else None))
    return rows


def summarize_ops(times: Dict[str, List[float]]) -> Dict[str, Dict]:
    """Median ms per formulation and its time relative to ours (first of its kind)."""
    rows, ours = {}, {}
    for key, ts in times.items():
        med = statistics.median(ts) * 1e3
        base = ours.setdefault(key.split(":")[0], med)
        rows[key] = {"median_ms": med, "x_ours": med / base}
    return rows


def _ops_lines(ops: Dict[str, Dict]) -> List[str]:
    if not ops:
        return []
    layer = ", ".join(f"{k}={v}" for k, v in LAYER.items())
    lines = ["", f"RPE op formulations and attention blocks (block 0 of the exported files), one "
             f"DeiT-S layer ({layer}), same run:", "",
             "| formulation | median ms | x ours |", "|---|---|---|"]
    return lines + [f"| {k} | {r['median_ms']:.2f} | {r['x_ours']:.2f} |" for k, r in ops.items()]


def write_report(result: Dict, out_dir: Path) -> Path:
    """JSON + Markdown in ``out_dir``: export_ort.*, or export_ort_own_pools.* for --own-pools."""
    stem = "export_ort" if result.get("thread_pool", "shared") == "shared" else \
        "export_ort_own_pools"
    lines = [f"# ONNX Runtime, exported models, on {result['device']}", "",
             f"batch {result['batch']}, {result['threads']} threads, onnxruntime "
             f"{result['onnxruntime']}, torch {result['torch']}, {result['repeats']} timed "
             f"rounds (median) of {result.get('sessions', 1)} session(s) per row, "
             f"{result.get('thread_pool', 'per session')} thread pool, load average "
             f"{result['load_before']} -> {result['load_after']}.",
             "", "| variant | model | median ms | p90 ms | img/s | throughput / plain | per round "
             "| best | / plain_ops | goal |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, row in result["results"].items():
        goal = "" if row["goal"] is None else \
            f">= {row['goal']:.2f} {'met' if row['meets_goal'] else 'missed'}"
        ops = row.get("ratio_to_plain_ops")
        lines.append(f"| {key} | {row['model']} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} "
                     f"| {row['images_per_s']:.1f} | {row['throughput_ratio']:.3f} "
                     f"| {row['ratio_round_median']:.3f} | {row['ratio_best']:.3f} "
                     f"| {'' if ops is None else f'{ops:.3f}'} | {goal} |")
    if any(row.get("ratio_to_plain_ops") for row in result["results"].values()):
        lines += ["", "throughput / plain: against plain DeiT-S on stock ONNX Runtime (the goals); "
                  "/ plain_ops: against plain DeiT-S with the library too (its attention blocks "
                  "run as RPEAttention as well): what the iRPE terms themselves cost."]
    return write_json_md(out_dir, stem, result, lines + _ops_lines(result.get("ops", {})))


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option, default in (("batch", 8), ("threads", 2), ("repeats", 7), ("warmup", 2),
                            ("sessions", 2)):
        parser.add_argument(f"--{option}", type=int, default=default)
    parser.add_argument("--quick", action="store_true",
                        help="2-block DeiT-Ti, batch 1, 1 round: checks the report only")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--own-pools", action="store_true",
                        help="a thread pool per session, as before the shared pool: shows how "
                             "much the idle sessions' spinning workers move the ratios")
    parser.add_argument("--no-custom-ops", action="store_true",
                        help="time only the function path (no custom-op library rows)")
    args = parser.parse_args(argv)
    if min(args.batch, args.threads, args.repeats, args.sessions) < 1 or args.warmup < 0:
        parser.error("--batch, --threads, --repeats and --sessions must be >= 1, --warmup >= 0")
    models, overrides = dict(MODELS), {}
    if args.quick:
        args.batch, args.repeats, args.warmup, args.sessions = 1, 1, 1, 1
        models = {k: v.replace("small", "tiny") for k, v in MODELS.items() if k != "irpe_qkv"}
        overrides = QUICK_OVERRIDES
    import onnxruntime
    torch.set_num_threads(args.threads)
    shared = not args.own_pools and share_thread_pool(args.threads)
    print(f"ONNX Runtime export benchmark: batch {args.batch}, {args.threads} threads, "
          f"{args.repeats} rounds", flush=True)
    library = None if args.no_custom_ops else find_library(OrtOptions.from_env().library)
    why = "--no-custom-ops" if args.no_custom_ops else "not built: plugins/onnxruntime/build.sh"
    print(f"custom-op rows: {library or f'none ({why})'}", flush=True)
    load_before = _load()
    with tempfile.TemporaryDirectory() as tmp:
        paths = export_models(models, Path(tmp), overrides)
        times = measure(paths, args.batch, args.threads, args.repeats, args.warmup,
                        library, args.sessions)
        blocks = {} if args.quick else attention_blocks(paths)
    ops = {} if args.quick else measure_ops(args.threads, 3 * args.repeats, args.warmup,
                                            library, blocks)
    result = {"device": device_name(), "onnxruntime": onnxruntime.__version__,
              "torch": torch.__version__, "batch": args.batch, "threads": args.threads,
              "repeats": args.repeats, "sessions": args.sessions, "quick": args.quick,
              "thread_pool": "shared" if shared else "per session",
              "date": time.strftime("%Y-%m-%d"),
              "custom_op_library": str(library) if library else None,
              "load_before": load_before, "load_after": _load(),
              "results": summarize(times, models, args.batch), "ops": summarize_ops(ops)}
    out_dir = args.out or Path(__file__).parent / "results" / result["device"]
    print(write_report(result, out_dir).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
