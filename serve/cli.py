"""``irpe serve``: start the inference server (demo models when nothing is configured)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import TYPE_CHECKING, Any, Callable, Dict, List, TypeVar

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .config import ServeSettings

T = TypeVar("T")

__all__ = ["add_parser", "cmd_serve"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe serve`` (heavy imports happen inside the command)."""
    p = sub.add_parser("serve", help="serve models over HTTP (REST + Open Inference Protocol v2)",
                       description="Serve the models of a repository file (YAML/TOML) or of "
                       "IRPE_SERVE_* variables; with neither (or --demo), the bundled demo "
                       "classifier and detector on ONNX Runtime (or --backend), on "
                       "127.0.0.1:8000.")
    p.add_argument("repository", nargs="?", help="model repository file (.yaml/.yml/.toml)")
    p.add_argument("--demo", action="store_true", help="also serve the demo models")
    p.add_argument("--backend", choices=("onnxruntime", "torch", "openvino"),
                   default="onnxruntime", help="backend of the demo models (default: "
                   "onnxruntime; openvino needs pip install 'irpe-deploy[openvino]')")
    p.add_argument("--device", default="cpu", help="device of the demo models: cpu, cuda, "
                   "cuda:N (onnxruntime-gpu / CUDA torch)")
    p.add_argument("--precision", choices=("fp32", "fp16", "bf16"), help="precision of every "
                   "torch- and openvino-backend model (overrides the repository; default fp16 "
                   "on cuda, fp32 on cpu; fp16 needs torch on cuda; openvino bf16 needs a CPU "
                   "with BF16)")
    p.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--threads", type=int, help="torch/onnxruntime/openvino CPU threads (0 = "
                   "default)")
    p.add_argument("--log-format", choices=("json", "text"), help="log lines (default json)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.add_argument("--prepare", action="store_true", help="load and warm up every model, "
                   "print a summary and exit (checks a repository; bakes demo ONNX files)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Build settings and models, then serve until SIGINT/SIGTERM (in-flight work drains)."""
    from .logs import setup_logging
    settings = _user_errors(_settings, args)
    setup_logging(settings.log_level, settings.log_format)
    if settings.repository and not settings.models and not args.demo:
        from irpe.errors import CLIError  # the demo is only for "nothing configured"
        raise CLIError(f"no models in {settings.repository} (add models: [...], or pass --demo "
                       "to serve the demo models)")
    if args.demo or not settings.models:  # after logging: a first start logs the ONNX export
        settings = _user_errors(_with_demo, settings, args)
    if args.precision:
        settings = _user_errors(_with_precision, settings, args.precision)
    from .app import create_app
    app = create_app(settings)
    if args.prepare:
        return _prepare(app)
    return _run(app, settings)


def _share_ort_pool(settings: ServeSettings) -> None:
    """`irpe serve` owns its process: its onnxruntime models share one intra-op pool
    (``ort_thread_pool: shared``), made before the server loads them (docs/serve.md)."""
    names = [m.name for m in settings.models if m.backend == "onnxruntime"]
    if settings.ort_thread_pool != "shared" or not names:
        return
    from irpe.runtime.onnxruntime.session import share_thread_pool
    shared = share_thread_pool(settings.threads)
    logging.getLogger("irpe.serve").info("onnxruntime thread pool", extra={
        "pool": "shared" if shared else "per_model", "threads": settings.threads,  # 0: default
        "models": names})


def _user_errors(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with settings and exporter problems turned into one-line CLI errors."""
    from pydantic import ValidationError

    from irpe.errors import CLIError

    from .errors import validation_message
    try:
        return fn(*args)
    except ValidationError as exc:
        raise CLIError(f"invalid settings: {validation_message(exc.errors())}") from None
    except RuntimeError as exc:  # demo: no ONNX exporter in this build
        raise CLIError(str(exc)) from None


def _settings(args: argparse.Namespace) -> ServeSettings:
    from .config import ServeSettings
    given = {"repository": args.repository, "host": args.host, "port": args.port,
             "threads": args.threads, "log_format": args.log_format,
             "log_level": args.log_level}
    return ServeSettings(**{k: v for k, v in given.items() if v is not None})


def _with_demo(settings: ServeSettings, args: argparse.Namespace) -> ServeSettings:
    from .demo import demo_models
    demo = demo_models(args.backend, settings.cache_dir, args.device)
    return settings.with_models(settings.models + demo)


def _with_precision(settings: ServeSettings, precision: str) -> ServeSettings:
    """Every torch- and openvino-backend model at ``precision`` (re-validated: fp16 on cpu, or
    on openvino, is refused)."""
    from .config import ModelConfig
    models = [ModelConfig.model_validate({**m.model_dump(), "precision": precision})
              if m.backend in ("torch", "openvino") else m for m in settings.models]
    return settings.model_copy(update={"models": models})


def _prepare(app: FastAPI) -> int:
    from .state import AppState
    state: AppState = app.state.irpe

    async def load() -> List[Dict]:
        await asyncio.gather(*(m.start() for m in state.models.values()))
        rows = [m.describe() | {"error": m.error} for m in state.models.values()]
        await asyncio.gather(*(m.stop() for m in state.models.values()))
        return rows

    rows = asyncio.run(load())
    print(f"{'model':<24} {'task':<15} {'backend':<12} {'state':<8} path")
    for row, model in zip(rows, state.models.values(), strict=True):
        print(f"{row['name']:<24} {row['task']:<15} {row['backend']:<12} "
              f"{row['state'] if not row['error'] else 'failed':<8} {model.cfg.path}"
              + (f"  ({row['error']})" if row["error"] else ""))
    return 1 if any(r["error"] for r in rows) else 0


def _run(app: FastAPI, settings: ServeSettings) -> int:
    """Serve on an explicit TCP socket; "serving" is logged once it accepts connections, and
    SIGTERM drains (serve.drain: readiness 503 for drain_grace_s, then in-flight requests)."""
    from .drain import DrainingServer
    from .net import listen_socket
    sock = listen_socket(settings.host, settings.port)
    _share_ort_pool(settings)  # here, not before: --prepare and start-up errors make no pool
    try:
        DrainingServer.for_app(app, settings).run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C: uvicorn re-raises it after its graceful shutdown
        # drained and stopped (logged): die by SIGINT as Python would, no traceback
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return 0
