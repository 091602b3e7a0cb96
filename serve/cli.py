"""``irpe serve``: start the inference server (demo models when nothing is configured)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .config import ServeSettings
    from .launch import Launch
    from .ray_settings import RaySettings

__all__ = ["add_parser", "cmd_serve"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe serve`` (heavy imports happen inside the command)."""
    p = sub.add_parser("serve", help="serve models over HTTP (REST + Open Inference Protocol v2)",
                       description="Serve the models of a repository file (YAML/TOML) or of "
                       "IRPE_SERVE_* variables; with neither (or --demo), the bundled demo "
                       "classifier and detector on OpenVINO where installed, else ONNX Runtime "
                       "(or --backend), on 127.0.0.1:8000.")
    p.add_argument("repository", nargs="?", help="model repository file (.yaml/.yml/.toml)")
    p.add_argument("--demo", action="store_true", help="also serve the demo models")
    p.add_argument("--backend", choices=("auto", "onnxruntime", "torch", "openvino"),
                   default="auto", help="backend of the demo models (default auto: openvino "
                   "on cpu where installed, as make run and the image have it, else "
                   "onnxruntime)")
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
    ray = p.add_argument_group("Ray Serve", "the same server as replicas of a Ray Serve "
                               "application (the repository's ray: section; needs pip install "
                               "'irpe-deploy[ray]'; docs/deploy.md)")
    ray.add_argument("--ray", action="store_true", help="deploy to Ray Serve and stay in the "
                     "foreground (Ray's HTTP proxy on --host/--port; Ctrl-C or SIGTERM drains "
                     "the replicas and removes the application)")
    ray.add_argument("--ray-address", metavar="ADDR", help="the cluster: 'auto' (the one this "
                     "machine is part of), ray://HOST:10001; default: ray.address, else a "
                     "local Ray started for the command")
    ray.add_argument("--ray-config", metavar="FILE", help="write a Ray Serve config file of "
                     "this server (for serve run / serve deploy, or a KubeRay RayService's "
                     "serveConfigV2) and exit; '-' prints it")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Build settings and models, then serve until SIGINT/SIGTERM (in-flight work drains);
    with --ray, on Ray Serve instead (serve.ray_app); with --ray-config, write its config."""
    from .logs import setup_logging
    if args.ray and args.prepare:
        from irpe.errors import CLIError
        raise CLIError("--prepare checks the models in this process; it does not go with --ray")
    launch = _launch(args)
    settings = launch.base_settings()
    setup_logging(settings.log_level, settings.log_format)
    if args.ray_address is not None:
        settings = settings.model_copy(update={"ray": _with_address(settings, args.ray_address)})
    if args.ray_config:
        from .ray_config import write_serve_config
        return write_serve_config(args.ray_config, launch, settings)
    settings = launch.complete(settings)  # after logging: a first start logs the ONNX export
    if args.ray:
        return _ray_runner()(launch, settings)
    from .app import create_app
    app = create_app(settings)
    if args.prepare:
        return _prepare(app)
    return _run(app, settings)


def _with_address(settings: ServeSettings, address: str) -> RaySettings:
    """The ``ray:`` settings with ``--ray-address`` (checked: one line, exit 2)."""
    from irpe.errors import InvalidInput

    from .ray_address import check_address
    try:
        check_address(address)
    except ValueError as exc:
        raise InvalidInput(f"--ray-address: {exc}") from None
    return settings.ray.model_copy(update={"address": address})


def _ray_runner() -> Callable[[Launch, ServeSettings], int]:
    """serve.ray_run.run_on_ray, or one line saying how to install Ray Serve."""
    try:
        from .ray_run import run_on_ray
    except ImportError as exc:
        from irpe.errors import CLIError
        raise CLIError(f"irpe serve --ray needs Ray Serve ({exc}): pip install "
                       "'irpe-deploy[ray]'") from None
    return run_on_ray


def _launch(args: argparse.Namespace) -> Launch:
    """The Launch of these arguments and of the IRPE_SERVE_* variables: the repository as an
    absolute path, so that a Ray replica, started in another folder or machine, reads the
    same file and serves the same models (issue 50: --ray-config once dropped the variables)."""
    from .launch import Launch
    overrides = {"host": args.host, "port": args.port, "threads": args.threads,
                 "log_format": args.log_format, "log_level": args.log_level}
    repository = str(Path(args.repository).absolute()) if args.repository else None
    launch = Launch(repository=repository, overrides=overrides, demo=args.demo,
                    backend=args.backend, device=args.device, precision=args.precision)
    return launch.with_environment()


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
