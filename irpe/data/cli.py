"""``irpe data shapes-cls|shapes-det``: write the synthetic shapes sets to disk."""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Dict

from ..argtypes import number
from ..errors import CLIError

# what the writers create, and all that --force removes from a non-empty output directory
LAYOUT = ("train", "val", "annotations", "shapes.json")


def _prepare(out: str, force: bool) -> Path:
    """Refuse a non-empty ``out`` unless ``force``. Nothing is removed yet: the writers stage
    the new set beside ``out`` and swap their entries in when it is complete (irpe.atomic)."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise CLIError(f"{out} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise CLIError(f"{out} is not empty; pass --force to overwrite it")
    return root


def _drop_stale(root: Path, summary: Dict) -> None:
    """After a forced write: remove the layout entries the new set did not write (a detection
    set's annotations/ under a classification set); other files in ``root`` stay."""

    from ..atomic import held_interrupts
    written = {"train", "val", "shapes.json"} | ({"annotations"} if "max_objects" in summary
                                                  else set())
    with held_interrupts():
        for name in set(LAYOUT) - written:
            path = root / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()


def _split_lines(summary: Dict) -> str:
    lines = []
    for split, info in summary["splits"].items():
        counts = info["per_class"].values()
        line = f"  {split:<5} {info['images']:>6} images"
        if "objects" in info:
            line += f" {info['objects']:>7} objects  {Path(info['annotations']).name}"
        else:
            spread = f"{min(counts)}" if min(counts) == max(counts) else \
                f"{min(counts)}-{max(counts)}"
            line += f"  ({spread} per class)"
        lines.append(line)
    return "\n".join(lines)


def cmd_shapes_cls(args: argparse.Namespace) -> int:
    """Write the shapes classification set (ImageFolder layout) and print a summary."""
    from .shapes import write_classification
    root = _prepare(args.out, args.force)
    start = time.perf_counter()
    summary = write_classification(root, args.train, args.val, args.seed, args.size,
                                   progress=True)
    _drop_stale(root, summary)
    print(f"wrote {root} (ImageFolder, {args.size}x{args.size}, seed {args.seed}, "
          f"{len(summary['classes'])} classes) in {time.perf_counter() - start:.1f} s")
    print(_split_lines(summary))
    return 0


def cmd_shapes_det(args: argparse.Namespace) -> int:
    """Write the shapes detection set (PNG + COCO json) and print a summary."""
    from .shapes import write_detection
    root = _prepare(args.out, args.force)
    start = time.perf_counter()
    summary = write_detection(root, args.train, args.val, args.seed, args.size,
                              args.max_objects, progress=True)
    _drop_stale(root, summary)
    print(f"wrote {root} (COCO, {args.size}x{args.size}, seed {args.seed}, up to "
          f"{args.max_objects} objects) in {time.perf_counter() - start:.1f} s")
    print(_split_lines(summary))
    return 0


def _common(p: argparse.ArgumentParser, train: int, val: int, size: int, min_size: int) -> None:
    p.add_argument("--out", required=True, help="output directory (must be empty or absent)")
    p.add_argument("--train", type=number(int, 1), default=train, help=f"train images ({train})")
    p.add_argument("--val", type=number(int, 0), default=val, help=f"val images ({val})")
    p.add_argument("--seed", type=number(int, 0), default=0, help="dataset seed (0)")
    p.add_argument("--size", type=number(int, min_size), default=size,
                   help=f"image side in pixels ({size}, at least {min_size})")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty directory, replacing train/, val/, annotations/")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe data`` and its subcommands on the top-level subparsers."""
    from .shapes import MIN_SIZE
    data = sub.add_parser("data", help="synthetic datasets: write the shapes sets to disk")
    cmds = data.add_subparsers(dest="data_command", required=True, metavar="DATASET")
    p = cmds.add_parser("shapes-cls", help="shapes classification set, ImageFolder layout")
    _common(p, 4000, 1000, 64, MIN_SIZE["classification"])
    p.set_defaults(func=cmd_shapes_cls)
    p = cmds.add_parser("shapes-det", help="shapes detection set, COCO json + PNG")
    _common(p, 4000, 500, 128, MIN_SIZE["detection"])
    p.add_argument("--max-objects", type=number(int, 1), default=5,
                   help="objects per image, at most (5)")
    p.set_defaults(func=cmd_shapes_det)
