"""The ``irpe`` command line: models, info, check."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Callable, List, Optional, Sequence

import torch

from . import __version__
from .argtypes import positive
from .bucket import Method, bucket_ids, coefficients, piecewise_index
from .errors import CLIError, IrpeError
from .models import list_models, model_info

DEFAULT_CHECK_MODEL = "deit_tiny_patch16_224_ctx_product_50_shared_k"
DEBUG_ENV = "IRPE_DEBUG"  # 1 (true, yes): every error with its traceback, as --debug
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT)


# Subcommands defined next to the code they drive; each module has ``add_parser(subparsers)``
# and must import only light modules at import time (heavy ones inside the command function).
# top-level packages the wheel installs beside irpe (generic names: see _foreign_package)
SHIPPED_BESIDE = ("export", "serve")
# top-level packages of a checkout that no install maps (benchmarks/, and plugins/ it imports):
# an editable install's console script reaches them through _checkout_on_path
CHECKOUT_ONLY = ("benchmarks",)
CHECKOUT_COMMANDS = {"benchmarks": "bench"}  # the command each of them adds
EXTENSIONS = ("irpe.data.cli", "irpe.weights", "irpe.training.cli", "export.cli", "serve.cli",
              "serve.tune.cli", "benchmarks.cli")


def cmd_models(args: argparse.Namespace) -> int:
    """Table of registered models with params, MACs at their default input size, top-1."""
    from .flops import default_input_size, profile_model
    names = list_models(args.pattern)
    if not names:
        raise CLIError(f"no model matches {args.pattern!r}")
    print(f"{'name':<52} {'params':>8} {'MACs':>8} {'input':>9} {'iRPE':<28} {'top-1':>5}")
    for name in names:
        info = model_info(name)
        rpe = info.config.get("rpe_config")
        params, macs = profile_model(name) if not args.no_macs else (None, None)
        p = f"{params / 1e6:.2f}M" if params else "-"
        m = f"{macs / 1e9:.2f}G" if macs else "-"
        top1 = f"{info.top1:.1f}" if info.top1 else "-"
        size = "x".join(map(str, default_input_size(name)))
        print(f"{name:<52} {p:>8} {m:>8} {size:>9} {rpe.to_string() if rpe else 'none':<28} "
              f"{top1:>5}")
    return 0


def _grid_lines(ids: torch.Tensor, height: int, width: int, query: int, skip: int) -> List[str]:
    row = ids[skip + query, skip:].view(height, width)
    return [" ".join(f"{int(v):>3}" for v in r) for r in row]


def cmd_info(args: argparse.Namespace) -> int:
    """Bucket counts and the bucket map around the centre query of a model's iRPE."""
    info = model_info(args.name)
    from .flops import default_input_size
    cfg = info.config.get("rpe_config")
    stride = info.config.get("patch_size", 32)  # DETR: ResNet stride 32
    size = default_input_size(info.name)
    grid = (size[0] // stride, size[1] // stride)
    height, width = args.height or grid[0], args.width or grid[1]
    print(f"model      {info.name} (family {info.family})")
    print(f"input      {size[0]}x{size[1]} -> grid {grid[0]}x{grid[1]}, "
          f"top-1 {info.top1 or '-'}, url {info.url or '-'}")
    if cfg is None:
        print("iRPE       none (baseline model)")
        return 0
    c = coefficients(cfg.ratio)
    print(f"iRPE       {cfg.to_string()} skip={cfg.skip} on={cfg.on} mode={cfg.mode}")
    print(f"piecewise  alpha={c.alpha:g} beta={c.beta:g} gamma={c.gamma:g} "
          f"beta_int={c.beta_int}")
    offsets = list(range(0, max(height, width)))
    mapped = piecewise_index(torch.tensor(offsets), cfg.ratio).tolist()
    print("offset     " + " ".join(f"{o:>3}" for o in offsets))
    print("bucket     " + " ".join(f"{b:>3}" for b in mapped))
    parts = [Method.CROSS_ROWS, Method.CROSS_COLS] if cfg.method == Method.CROSS else [cfg.method]
    query = (height // 2) * width + width // 2
    for method in parts:
        ids = bucket_ids(method, cfg.ratio, height, width, cfg.skip)
        print(f"\n[{method.value}] grid {height}x{width} + {cfg.skip} skip token(s): "
              f"{cfg.num_buckets} buckets allocated, {ids.unique().numel()} used")
        print(f"bucket ids of key positions seen from query (row {height // 2}, col {width // 2}):")
        print("\n".join(_grid_lines(ids, height, width, query, cfg.skip)))
    return 0


def _check_step(report: List[tuple], label: str, fn: Callable[[], str]) -> None:
    start = time.perf_counter()
    try:
        detail, ok = fn(), True
    except Exception as exc:  # a self-test reports every failure instead of stopping
        detail, ok = f"{type(exc).__name__}: {exc}", False
    report.append((label, ok, detail, time.perf_counter() - start))


def cmd_check(args: argparse.Namespace) -> int:
    """Self-test: ids, ops, a model forward and a checkpoint round trip; non-zero on failure."""
    from . import selfcheck
    info = model_info(args.model)  # unknown names are a usage error, not a failed check
    patch = info.config.get("patch_size")  # ViTs; DETR's ResNet takes any size
    if patch and args.img_size % patch:
        fit = max(patch, args.img_size // patch * patch)
        raise CLIError(f"--img-size {args.img_size} is not a multiple of {info.name}'s patch "
                       f"size {patch} (try {fit})")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report: List[tuple] = []
    for label, fn in selfcheck.steps(args.model, args.batch, args.img_size):
        _check_step(report, label, fn)
    print(f"irpe {__version__} self-check (torch {torch.__version__}, {args.threads} threads)")
    for label, ok, detail, secs in report:
        print(f"  [{'PASS' if ok else 'FAIL'}] {label:<34} {secs * 1000:8.1f} ms  {detail}")
    failed = sum(not ok for _, ok, _, _ in report)
    print(f"{len(report) - failed} passed, {failed} failed")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="irpe", description="iRPE models: inspect, check, "
                                     "and (in later commands) export and serve.")
    parser.add_argument("--version", action="version", version=f"irpe {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of every "
                        f"error, a user error too (also {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("models", help="list registered models with params and MACs")
    p.add_argument("pattern", nargs="?", default="*", help="shell pattern, e.g. 'deit_small*'")
    p.add_argument("--no-macs", action="store_true", help="skip the params/MACs count")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("info", help="iRPE config, bucket counts and bucket map of a model")
    p.add_argument("name", help="registered model name (see `irpe models`)")
    p.add_argument("--height", type=positive, help="patch-grid height (default: model's)")
    p.add_argument("--width", type=positive, help="patch-grid width (default: model's)")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("check", help="self-test: bucket ids, ops, model forward, checkpoint")
    p.add_argument("--model", default=DEFAULT_CHECK_MODEL, help="model to build and run")
    p.add_argument("--batch", type=positive, default=2, help="batch size of the forward")
    p.add_argument("--img-size", type=positive, default=224, help="input height = width")
    p.add_argument("--threads", type=positive, default=2, help="torch CPU threads")
    p.set_defaults(func=cmd_check)
    for module in EXTENSIONS:
        _add_extension(sub, module)
    return parser


def _add_extension(sub: argparse._SubParsersAction, module: str) -> None:
    """Register the subcommands of ``module`` if that module exists in this checkout."""
    top = module.partition(".")[0]
    if top in CHECKOUT_ONLY and not _checkout_on_path(top):
        _needs_checkout(sub, top)  # an install without the checkout (a wheel)
        return
    foreign = _foreign_package(top)
    if foreign:
        print(f"irpe: warning: {foreign} hides irpe-deploy's package of that name; its "
              "commands are not available (see docs/DECISIONS.md, install footprint)",
              file=sys.stderr)
        return
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            return  # the package that would define these commands is not part of this build
        raise
    mod.add_parser(sub)


def _needs_checkout(sub: argparse._SubParsersAction, top: str) -> None:
    """The command of a checkout-only package, where this install has no checkout: it says
    where the command lives instead of argparse's "invalid choice"."""
    why = (f"{top}/ is part of the repository checkout, not of this installed package: run "
           f"`irpe {CHECKOUT_COMMANDS[top]}` from a checkout (`make install`, then "
           f"`.venv/bin/irpe {CHECKOUT_COMMANDS[top]}`, or `python -m irpe "
           f"{CHECKOUT_COMMANDS[top]}` in it)")
    p = sub.add_parser(CHECKOUT_COMMANDS[top], help="(repository checkout only)", description=why)
    p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def refuse(args: argparse.Namespace) -> int:
        raise CLIError(why)
    p.set_defaults(func=refuse)


def _checkout_on_path(top: str) -> bool:
    """Whether irpe runs from a checkout that holds ``top``; then the checkout root is appended
    to sys.path if nothing finds ``top`` yet: `make install` maps only the shipped packages, so
    `.venv/bin/irpe` would not see benchmarks/ (`python -m irpe` does, from the cwd). Appended,
    it hides nothing installed."""
    root = Path(__file__).resolve().parents[1]
    if not ((root / top / "__init__.py").is_file() and (root / "pyproject.toml").is_file()):
        return False
    if importlib.util.find_spec(top) is None:
        sys.path.append(str(root))
    return True


def _foreign_package(top: str) -> Optional[str]:
    """Where another distribution's top-level ``export``/``serve`` package was found first on
    sys.path (ours sit beside irpe/), or None; nothing is imported."""
    if top not in SHIPPED_BESIDE + CHECKOUT_ONLY:
        return None
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    found = Path(next(iter(spec.submodule_search_locations or []), spec.origin or ""))
    ours = Path(__file__).resolve().parents[1]
    return None if found.resolve().parent == ours else str(found)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``irpe`` console script. A user error (:class:`irpe.errors.IrpeError`)
    is one line and exit status 2; any other exception propagates with its traceback (a bug's
    traceback is what its report needs). ``--debug`` or ``IRPE_DEBUG=1``: user errors too.

    Ctrl-C (SIGINT as KeyboardInterrupt) anywhere: one line ``irpe COMMAND: interrupted`` and
    exit status 130, with ``--debug`` too (an interrupt is no bug). The writes it stopped left
    nothing behind (irpe.atomic), and no "wrote" or "done" line follows it: a file moved into
    place while the Ctrl-C was held is complete and kept, but the command reports it as
    interrupted, not as done (docs/DECISIONS.md, "Ctrl-C")."""
    command: Optional[str] = None
    previous = _defer_interrupts_in_imports()
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        return _run(args)
    except KeyboardInterrupt:
        return _interrupted(command)
    finally:  # main() called in a process that goes on (tests): its handler back
        if previous is not None and signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; user errors become one line and exit 2 (see :func:`main`)."""
    debug = args.debug or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")
    try:
        return args.func(args)
    except BrokenPipeError:  # `irpe info ... | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0
    except IrpeError as exc:
        if debug:
            raise
        return _user_error(args.command, exc)
    except OSError as exc:
        # An OSError that carries a filename comes from the system about a path (open, stat,
        # mkdir, ... of a file or folder the user named or chose: "[Errno 2] No such file or
        # directory: 'x.onnx'"): the line names the file and the system's reason, which is all
        # the user needs, so it is reported like a user error. One without a filename (a socket,
        # a library) is not known to be the user's input: it keeps its traceback.
        if debug or exc.filename is None:
            raise
        return _user_error(args.command, exc)


def _defer_interrupts_in_imports() -> Optional[Callable]:
    """Ctrl-C raises KeyboardInterrupt as Python's own handler does, except inside an import:
    there it is sent again 50 ms later, until the import has finished. Libraries import lazily
    from C++ callbacks (torch.onnx export imports triton in one), and a KeyboardInterrupt
    raised into C++ code that cannot pass it on aborted the process (exit 134, "terminate
    called after throwing an instance of 'nanobind::python_error'"). A SIGINT that Python does
    not handle (ignored in a background job) is left as it is. Returns the handler replaced
    (None when none was)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return None
    signal.signal(signal.SIGINT, _on_sigint)
    return previous


def _on_sigint(signum: int, frame: Optional[FrameType]) -> None:
    if not _importing(frame):
        raise KeyboardInterrupt
    later = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    later.daemon = True
    later.start()


def _importing(frame: Optional[FrameType]) -> bool:
    """Whether ``frame`` runs inside an import (importlib's frames are on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _interrupted(command: Optional[str]) -> int:
    """The one line of a Ctrl-C, and 130 (128 + SIGINT, what a shell reports for one). More
    Ctrl-Cs (a key held down) are ignored from here on: the command has already stopped, and
    one arriving while this line is printed or the interpreter exits would print a traceback."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("RANK", "0") == "0":  # torchrun: rank 0's line stands for every rank
        print(f"irpe{' ' + command if command else ''}: interrupted", file=sys.stderr,
              flush=True)
    return INTERRUPTED


def _user_error(command: str, exc: Exception) -> int:
    print(f"irpe {command}: error: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
