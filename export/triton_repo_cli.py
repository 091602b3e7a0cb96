"""``irpe triton-repo`` (registered by export.cli): a Triton model repository on disk."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO, Type, Union

from .triton_repo import DEFAULT_ORT_OPS, RepoOptions, write_repository

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["add_parser", "cmd_triton_repo"]
_ROOT = Path(__file__).resolve().parents[1]


def cmd_triton_repo(args: argparse.Namespace) -> int:
    """``irpe triton-repo``: write the repository and print its tree."""
    options = RepoOptions(name=args.name, max_batch_size=args.max_batch_size,
                          max_queue_delay_us=args.max_queue_delay_us, instances=args.instances,
                          kind=args.kind, ort_ops=args.ort_ops, trt_plugins=args.trt_plugin,
                          mount=args.mount, force=args.force)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _warn_line
        dirs = write_repository(args.output, args.artifacts, options)
    for d in dirs:
        files = sorted(p for p in d.rglob("*") if p.is_file())
        print(f"wrote {d}: " + ", ".join(
            f"{p.relative_to(d)} ({p.stat().st_size / 1e6:.1f} MB)" if p.stat().st_size > 1e5
            else str(p.relative_to(d)) for p in files))
    print(f"serve with: {_server_command(args.output)}")
    return 0


def _warn_line(message: Union[Warning, str], category: Type[Warning], filename: str, lineno: int,
               file: Optional[TextIO] = None, line: Optional[str] = None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _server_command(repo: StrPath) -> str:
    text = (Path(repo) / "README.md").read_text(encoding="utf-8")
    return text.split("```\n", 2)[1].strip()


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe triton-repo`` (called by export.cli.add_parser)."""
    p = sub.add_parser("triton-repo", help="write a Triton Inference Server model repository",
                       description="One model directory per artifact: an .onnx file from "
                       "`irpe export`, an engine from `irpe build-engine` (with its .json "
                       "sidecar), or a model name / trained-model file (exported first).")
    p.add_argument("artifacts", nargs="+", help=".onnx, .engine/.plan, model name or "
                   ".safetensors")
    p.add_argument("-o", "--output", required=True, help="repository directory")
    p.add_argument("--name", help="model directory name (one artifact; default: model name)")
    p.add_argument("--max-batch-size", type=int,
                   help="default 8 for ONNX, the engine profile's maximum for plans")
    p.add_argument("--max-queue-delay-us", type=int, default=5000,
                   help="dynamic batching delay (default 5000)")
    p.add_argument("--instances", type=int, default=1, help="instance_group count (default 1)")
    p.add_argument("--kind", default="gpu", choices=("gpu", "cpu", "auto"),
                   help="instance_group kind (default gpu)")
    p.add_argument("--ort-ops", default="auto", help="ONNX Runtime custom-op library to "
                   f"reference: auto ({DEFAULT_ORT_OPS.relative_to(_ROOT)} if built), none, "
                   "or a path")
    p.add_argument("--trt-plugin", action="append", default=[],
                   help="TensorRT plugin library (default: the one the engine was built with)")
    p.add_argument("--mount", default="/models",
                   help="where the server mounts the repository (library paths; default /models)")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty directory, replacing same-named models")
    p.set_defaults(func=cmd_triton_repo)
