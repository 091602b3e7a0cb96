"""``irpe tune MODEL_OR_REPO``: the serving configuration that fits this machine, found by
measurement (what Triton's Model Analyzer does for Triton). docs/tune.md.

Values are checked by serve.tune.options (one line and exit 2 for a bad one). Heavy imports
happen inside the command.
"""
from __future__ import annotations

import argparse

from irpe.errors import CLIError

from .options import AXES, Options

__all__ = ["add_parser", "cmd_tune"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe tune``."""
    p = sub.add_parser("tune", help="find the serving configuration that fits this machine, by "
                       "measurement (irpe serve processes under HTTP load)",
                       description="Measure serving configurations of one model (backend, "
                       "precision, batching, instances, threads, OpenVINO streams), each in its "
                       "own `irpe serve` process under real HTTP load, and write the best for "
                       "the goal as a repository file `irpe serve` runs as it is, with a table, "
                       "a plot and Triton's config.pbtxt (docs/tune.md).")
    p.add_argument("model", metavar="MODEL_OR_REPO", help="repository file (.yaml/.toml), "
                   "model file (.onnx, OpenVINO .xml, .safetensors) or registered model name")
    p.add_argument("--model", dest="repo_model", metavar="NAME",
                   help="the repository's model to tune (when it has several)")
    p.add_argument("--clients", default="1", help="closed-loop client counts, e.g. 1,16 "
                   "(default 1); throughput is scored at the most")
    p.add_argument("--p99-ms", help="SLO: p99 latency at every client count (and the rate)")
    p.add_argument("--rate", help="goal: min p99 at this open-loop rate (requests/s)")
    p.add_argument("--budget-min", default="10", help="wall-clock minutes for the whole "
                   "search (default 10); nothing is started once spent")
    p.add_argument("-o", "--output", default="tuned.yaml", help="tuned repository file "
                   "(default tuned.yaml); beside it: .md table, .png plot, .config.pbtxt, and "
                   "the folder .tune/ (results file, server logs, int8 model)")
    p.add_argument("--backends", help="comma list (default: every one that runs the file here)")
    p.add_argument("--precisions", help="comma list of fp32, bf16, int8 (default: those this "
                   "CPU runs fast: bf16 with AVX512_BF16/AMX, int8 with VNNI)")
    p.add_argument("--axes", default=",".join(AXES), help=f"axes searched, in order (default "
                   f"{','.join(AXES)})")
    p.add_argument("--val-data", help="accuracy gate data: an image folder (val/ split) or "
                   "'shapes' (default shapes for the demo models; without it int8/bf16 are not "
                   "tried)")
    p.add_argument("--margin", default="1.0", help="accuracy gate: points of top-1 (AP50) a "
                   "reduced precision may lose against fp32 (default 1.0)")
    p.add_argument("--val-images", default="500", help="accuracy gate on shapes: validation "
                   "images scored per precision (default 500)")
    p.add_argument("--short-s", default="3", help="seconds per load of a screening run")
    p.add_argument("--full-s", default="10", help="seconds per load of a final-rung run")
    p.add_argument("--warmup-s", default="1", help="unrecorded seconds of load before each")
    p.add_argument("--keep", default="2", help="candidates kept after each axis (default 2)")
    p.add_argument("--final", default="2", help="best screening runs re-run at full length, "
                   "besides the default configuration (default 2; 0: the screening decides)")
    p.add_argument("--remeasure", action="store_true", help="serve the tuned file in a fresh "
                   "process and measure it again at full length")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    """Resolve the model, search, write the tuned file and its report (serve.tune.run)."""
    options = Options(args)
    try:
        import benchmarks.serve_load  # noqa: F401  (the load generator of irpe bench serve)
    except ImportError:
        raise CLIError("irpe tune measures with the load generator of `irpe bench serve` "
                       "(benchmarks/, part of the repository checkout, and the bench extra: "
                       "pip install 'irpe-deploy[bench]')") from None
    from .run import tune
    return tune(options, args.model, args.repo_model)
