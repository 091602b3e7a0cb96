"""``irpe tune MODEL_OR_REPO``: the serving configuration that fits this machine, found by
measurement (what Triton's Model Analyzer does for Triton). docs/tune.md.

Values are checked here, not by argparse types, so a bad one is one line and exit 2 (an
argparse type error would print the usage first). Heavy imports happen inside the command.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import List, Optional, Sequence

from irpe.errors import CLIError

__all__ = ["add_parser", "cmd_tune", "Options"]

AXES = ("runtime", "batching", "parallelism")


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


def _number(flag: str, text: Optional[str], minimum: float, kind: type = float,
            strict: bool = False) -> Optional[float]:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise CLIError(f"{flag}: not {'an integer' if kind is int else 'a number'}: "
                       f"{text!r}") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise CLIError(f"{flag}: must be {'>' if strict else '>='} {minimum:g}, got {text}")
    return value


def _choices(flag: str, text: Optional[str], allowed: Sequence[str]) -> Optional[List[str]]:
    if text is None:
        return None
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if not values or bad:
        raise CLIError(f"{flag}: expected a comma list of {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(values))


class Options:
    """The checked arguments of one ``irpe tune``."""

    def __init__(self, args: argparse.Namespace) -> None:
        try:
            self.clients = tuple(int(c) for c in args.clients.split(",") if c.strip())
        except ValueError:
            raise CLIError(f"--clients: expected a comma list of integers, got "
                           f"{args.clients!r}") from None
        if not self.clients or min(self.clients) < 1 or max(self.clients) > 4096:
            raise CLIError(f"--clients: client counts from 1 to 4096, got {args.clients!r}")
        self.p99_ms = _number("--p99-ms", args.p99_ms, 0, strict=True)
        self.rate = _number("--rate", args.rate, 0, strict=True)
        self.budget_min = float(_number("--budget-min", args.budget_min, 0, strict=True) or 0)
        self.margin = float(_number("--margin", args.margin, 0) or 0)
        self.val_images = int(_number("--val-images", args.val_images, 1, int) or 1)
        self.short_s = float(_number("--short-s", args.short_s, 0.1) or 0)
        self.full_s = float(_number("--full-s", args.full_s, 0.1) or 0)
        self.warmup_s = float(_number("--warmup-s", args.warmup_s, 0) or 0)
        self.keep = int(_number("--keep", args.keep, 1, int) or 1)
        self.final = int(_number("--final", args.final, 0, int) or 0)
        self.backends = _choices("--backends", args.backends,
                                 ("openvino", "onnxruntime", "torch"))
        self.precisions = _choices("--precisions", args.precisions, ("fp32", "bf16", "int8"))
        self.axes = _choices("--axes", args.axes, AXES) or []
        self.output = Path(args.output)
        if self.output.suffix.lower() not in (".yaml", ".yml"):
            raise CLIError(f"-o {args.output}: the tuned repository file is YAML (.yaml/.yml)")
        if args.val_data and args.val_data != "shapes" and not Path(args.val_data).is_dir():
            raise CLIError(f"--val-data {args.val_data}: not a folder (or 'shapes')")
        if args.val_data and args.val_data != "shapes" and \
                not (Path(args.val_data) / "val").is_dir():
            raise CLIError(f"--val-data {args.val_data}: no val/ split in it (irpe eval scores "
                           "DIR/val)")
        self.val_data: Optional[str] = args.val_data
        self.remeasure: bool = args.remeasure

    def siblings(self) -> List[Path]:
        """The tuned file and what is written beside it: table, plot, Triton config."""
        stem = self.output.with_suffix("")
        return [self.output, stem.with_suffix(".md"), stem.with_suffix(".png"),
                stem.with_suffix(".config.pbtxt")]

    def workdir(self) -> Path:
        """The tune's own folder beside the output: results file, server logs, int8 model."""
        return self.output.resolve().with_suffix(".tune")


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
