"""The checked arguments of one ``irpe tune`` (serve.tune.cli parses them, serve.tune.run
uses them): values are checked here, not by argparse types, so a bad one is one line and exit 2
(an argparse type error would print the usage first)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import List, Optional, Sequence

from irpe.errors import CLIError

__all__ = ["AXES", "Options"]

AXES = ("runtime", "batching", "parallelism")


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
