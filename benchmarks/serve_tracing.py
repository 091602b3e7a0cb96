"""What tracing costs `irpe serve`: the same model served by up to three servers at once,
alternated at every round (issue 51's goal: tracing off within 2% of the code before tracing,
on at ratio 1.0 exporting over OTLP/HTTP within 5%).

``python -m benchmarks.serve_tracing --baseline DIR``: the model of `irpe bench serve`
(``--model deit_s``: an untrained DeiT-S iRPE-K at 224x224, the cached ONNX export; ``tiny``: the
shapes classifier) behind three `irpe serve` processes: ``baseline`` (the checkout DIR, e.g. a
``git worktree`` of the commit before tracing), ``tracing off`` (this checkout, default
settings) and ``tracing on`` (this checkout, ``otlp_endpoint`` = a receiver process on loopback,
``trace_sample_ratio: 1.0``). Closed-loop clients (the lean client of benchmarks.serve_load)
POST the PNG that `irpe bench serve` sends to ``/v1/models/NAME/classify?top_k=1``; every round
runs each server in turn for ``--duration`` seconds after ``--warmup``. Printed: a row per round
and server, then per server the median img/s and p50 over the rounds and their ratio to the
first server. Every server gets the same iRPE library files (this checkout's build: ONNX Runtime
custom ops, OpenVINO extension), so a worktree without a build is not slower for lack of them.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from benchmarks import serve_bench
from benchmarks.common import int_list
from benchmarks.serve_load import lean_closed_loop, png, server_process, write_repository

__all__ = ["main", "receiver_process"]

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def receiver_process() -> Iterator[Tuple[str, List[Dict]]]:
    """``python -m benchmarks.otlp_receiver`` (its own process: its work does not share the
    load generator's GIL); yields (traces URL, a list that gets its summary once it stops)."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.otlp_receiver"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    summary: List[Dict] = []
    try:
        yield proc.stdout.readline().strip(), summary
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=300)
        summary.extend(json.loads(line) for line in out.splitlines() if line.startswith("{"))


def _model(key: str, backend: str, max_batch: int, cache: Path) -> Dict:
    """The served model as `irpe bench serve` serves it (benchmarks.serve_bench)."""
    name, _ = serve_bench.MODELS[key]
    cfg = serve_bench.model_config(name, backend, cache, max_batch)
    return cfg.model_dump(mode="json", exclude_none=True, include={
        "name", "path", "backend", "max_batch_size", "max_queue_size"})


def _library() -> Dict:
    """This checkout's iRPE libraries (ONNX Runtime custom ops, OpenVINO extension) for every
    server, where they are built: a baseline checkout without a build is not slower for it."""
    from irpe.runtime.onnxruntime.session import default_library as ort_library
    from irpe.runtime.openvino.library import default_library as ov_library
    built = {"ort_ops_library": ort_library(), "ov_ops_library": ov_library()}
    return {key: str(path) for key, path in built.items() if path.is_file()}


def _servers(args: argparse.Namespace, receiver: str) -> Dict[str, Tuple[Optional[Path], Dict]]:
    on = {"otlp_endpoint": receiver, "trace_sample_ratio": args.ratio}
    return {**({"baseline": (args.baseline, {})} if args.baseline else {}),
            "tracing off": (None, {}), "tracing on": (None, on)}


def _row(row: Dict) -> str:
    return (f"| {row['server']} | {row['round']} | {row['load']} | {row['images_per_s']:.1f} | "
            f"{row.get('p50_ms', float('nan')):.1f} | {row.get('p99_ms', float('nan')):.1f} | "
            f"{row['errors'] or '-'} | {row['loadavg']:.1f} |")


def summary(rows: List[Dict], servers: Sequence[str]) -> List[str]:
    """Markdown lines: per server the median img/s and p50 over the rounds, and both as a
    ratio to the first server's."""
    med = {name: {k: statistics.median(r[k] for r in rows if r["server"] == name)
                  for k in ("images_per_s", "p50_ms")} for name in servers}
    first = med[servers[0]]
    lines = [f"| server | img/s | p50 ms | img/s / {servers[0]} | p50 / {servers[0]} |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {m['images_per_s']:.1f} | {m['p50_ms']:.1f} | "
              f"{m['images_per_s'] / first['images_per_s']:.3f} | "
              f"{m['p50_ms'] / first['p50_ms']:.3f} |" for n, m in med.items()]
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_tracing",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, help="the checkout before tracing (a git worktree)")
    p.add_argument("--model", choices=list(serve_bench.MODELS), default="deit_s")
    p.add_argument("--backend", choices=("onnxruntime", "openvino"), default="openvino",
                   help="as irpe bench serve --backend (the DeiT-S figure of docs/: openvino)")
    p.add_argument("--clients", default="16", help="closed-loop client counts")
    p.add_argument("--rounds", type=int, default=5, help="rounds over every level and server")
    p.add_argument("--duration", type=float, default=20.0, help="recorded seconds per run")
    p.add_argument("--warmup", type=float, default=3.0, help="unrecorded seconds per run")
    p.add_argument("--max-batch", type=int, default=8, help="server max_batch_size")
    p.add_argument("--threads", type=int, default=2, help="server --threads")
    p.add_argument("--ratio", type=float, default=1.0, help="trace_sample_ratio when on")
    p.add_argument("--out", type=Path, help="write every row and the receiver's count as JSON")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Alternated closed-loop runs of every server; rows, the median summary, the spans the
    receiver got (so 'tracing on' is known to have exported)."""
    args = _parser().parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="irpe-serve-tracing-"))
    model = _model(args.model, args.backend, args.max_batch, _cache())
    body = png(serve_bench.MODELS[args.model][1])
    path, headers = f"/v1/models/{model['name']}/classify?top_k=1", {"content-type": "image/png"}
    rows: List[Dict] = []
    with receiver_process() as (receiver, received), contextlib.ExitStack() as stack:
        servers = _servers(args, receiver)
        urls = {name: stack.enter_context(server_process(write_repository(
            folder / name.replace(" ", "_"), [model], **_library(), **settings), args.threads,
            root=root)) for name, (root, settings) in servers.items()}
        print(f"model {model['name']} ({args.backend}), load average {os.getloadavg()}\n\n"
              "| server | round | clients | img/s | p50 ms | p99 ms | errors | load1 |\n"
              "|---|---|---|---|---|---|---|---|", flush=True)
        for rnd in range(1, args.rounds + 1):
            for clients in int_list(args.clients):
                for name, url in urls.items():
                    load = os.getloadavg()[0]
                    row = asyncio.run(lean_closed_loop(url, path, body, headers, clients,
                                                       args.duration, args.warmup))
                    rows.append({**row, "server": name, "round": rnd, "loadavg": load})
                    print(_row(rows[-1]), flush=True)
    for clients in int_list(args.clients):
        print(f"\nmedian over {args.rounds} rounds, {clients} clients\n")
        print("\n".join(summary([r for r in rows if r["load"] == clients], list(urls))))
    print(f"\nOTLP receiver: {received[0] if received else 'no summary'}; logs: {folder}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "receiver": received}, indent=1))
    return 0


def _cache() -> Path:
    """`irpe bench serve`'s scratch folder (the untrained weights and their ONNX export)."""
    return Path(tempfile.gettempdir()) / "irpe-bench-serve"


if __name__ == "__main__":
    raise SystemExit(main())
