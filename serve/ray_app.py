"""The server as a Ray Serve application: every replica runs the app of ``irpe serve``.

One deployment, :class:`IrpeReplica`, whose ingress is :func:`serve.app.create_app` of the
replica's :class:`serve.launch.Launch` (the same routes, batching, errors and metrics; REST and
the Open Inference Protocol through Ray's HTTP proxy). In Ray's terms:

- **Started** once its models are loaded and warmed up (the app's lifespan waits for them), so
  Ray routes nothing to a replica before it can answer; its health check fails while any model
  is not ready, and Ray replaces it.
- **Drained** by Ray when it stops (scale-down, redeploy, ``serve delete``): routed nothing
  more, requests in flight get ``shutdown_timeout_s``, then the app's lifespan stops the models
  (queued batches first), as ``irpe serve`` does after SIGTERM. Under ``irpe serve --ray``,
  its SIGTERM first sets a :class:`DrainFlag` every replica waits on: readiness 503 and
  ``Connection: close`` for ``drain_grace_s`` (serve.drain), then the delete.
- Every response names its replica (``X-Irpe-Replica: NODE/REPLICA``): which node answered.

Entry points: :func:`build` (the ``import_path`` of ``irpe serve --ray-config``'s file, for
``serve run`` / ``serve deploy`` / KubeRay) and :func:`deploy` (``irpe serve --ray``:
:mod:`serve.ray_run`).
Needs ``pip install 'irpe-deploy[ray]'``; docs/deploy.md ("Ray Serve").
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Dict, Optional, Tuple, cast

import ray
from ray import serve
from ray.serve.deployment import Application, Deployment
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from irpe.errors import CLIError, ResourceError

from .app import create_app
from .config import ServeSettings
from .drain import CloseWhileDraining
from .launch import Launch
from .logs import setup_logging

__all__ = ["DrainFlag", "IrpeReplica", "REPLICA", "REPLICA_HEADER", "application", "build",
           "deploy", "deployment_reason"]

log = logging.getLogger("irpe.serve")

REPLICA_HEADER = "x-irpe-replica"


class ReplicaHeader:
    """ASGI middleware: every HTTP response carries ``X-Irpe-Replica: value``, and not the
    app's ``X-Request-Id``: Ray's proxy passes its request id in and writes it out itself."""

    def __init__(self, app: ASGIApp, value: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), value.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", [])
                        if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*kept, self.header]}
            await send(message)

        await self.app(scope, receive, named_send)


@serve.ingress()
class IrpeReplica:
    """One replica: the app of ``irpe serve`` for the models of ``launch`` (its models load in
    the app's lifespan, which Ray runs after this constructor)."""

    def __init__(self, launch: Dict[str, Any], default_threads: int,
                 drain_flag: Optional[Tuple[str, str]] = None) -> None:
        resolved = Launch.model_validate(launch)
        settings = resolved.settings(default_threads)
        setup_logging(settings.log_level, settings.log_format)
        self._app = create_app(settings, load_before_serving=True)
        context = serve.get_replica_context()
        node = ray.get_runtime_context().get_node_id()[:12]
        self._app.add_middleware(ReplicaHeader, value=f"{node}/{context.replica_id.unique_id}")
        if drain_flag is not None:  # irpe serve --ray: its SIGTERM drains every replica
            threading.Thread(target=self._watch, args=drain_flag, daemon=True,
                             name="irpe-drain-flag").start()

    def __serve_build_asgi_app__(self) -> ASGIApp:
        state = self._app.state.irpe
        return CloseWhileDraining(self._app, lambda: state.draining)

    def _watch(self, name: str, namespace: str) -> None:
        """Wait on the command's DrainFlag; once set, this replica drains as irpe serve does
        (readiness 503, every answer ``Connection: close``) while it still serves."""
        try:
            ray.get(ray.get_actor(name, namespace=namespace).wait.remote())
        except Exception as exc:  # noqa: BLE001 (the command is gone: Ray stops this replica)
            log.info("drain flag lost", extra={"error": str(exc)})
            return
        self._app.state.irpe.draining = True

    async def check_health(self) -> None:
        """Ray's health check: unhealthy while any model is not ready (or while stopping);
        draining is healthy (Ray would replace the replica while it finishes its requests)."""
        state = self._app.state.irpe
        why = None if state.draining else state.not_ready()
        if why is not None:
            raise RuntimeError(why)


@ray.remote(num_cpus=0)
class DrainFlag:
    """One named actor of ``irpe serve --ray``: every replica waits on :meth:`wait` (one
    call each, no polling); the command's SIGTERM calls :meth:`set` and all of them drain."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self) -> bool:
        await self.event.wait()
        return True

    def set(self) -> bool:
        self.event.set()
        return True


# the Serve deployment (options: application()); typed by hand, as serve.ingress returns an
# untyped class
REPLICA = cast(Deployment, serve.deployment(IrpeReplica))


def application(launch: Launch, settings: ServeSettings,
                drain_flag: Optional[Tuple[str, str]] = None) -> Application:
    """The Serve application of ``launch``: one deployment with the ``ray:`` section's
    replicas, resources, autoscaling and health checks; its replicas drain when the
    DrainFlag named ``drain_flag`` (name, namespace) is set."""
    ray_settings = settings.ray
    on_cuda = [m.name for m in settings.models if m.device.startswith("cuda")]
    if on_cuda and ray_settings.num_gpus == 0:
        raise CLIError(f"models on cuda ({', '.join(on_cuda)}) need ray.num_gpus > 0 (a "
                       "fraction shares one GPU between replicas)")
    options = ray_settings.deployment_options(settings.shutdown_timeout_s)
    deployment = REPLICA.options(name=ray_settings.application, **options)
    return deployment.bind(launch.model_dump(), ray_settings.replica_threads(), drain_flag)


def build(args: Dict[str, Any]) -> Application:
    """Ray Serve application builder (``import_path: serve.ray_app:build``): ``args`` is a
    :class:`Launch`, resolved here on the cluster (files and ``ray:`` section read there)."""
    launch = Launch.model_validate(args)
    return application(launch, launch.settings())


def deploy(launch: Launch, settings: ServeSettings,
           drain_flag: Optional[Tuple[str, str]] = None) -> None:
    """Deploy the application to the Ray this process is connected to (Serve started there,
    or started by this call with Ray's defaults); "serving" is logged once every replica
    runs (models loaded). A replica that fails to start is a ResourceError (one line)."""
    name = settings.ray.application
    try:
        serve.run(application(launch, settings, drain_flag), name=name,
                  route_prefix=settings.ray.route_prefix)
    except RuntimeError as exc:  # replicas failed to start: the last line of Ray's reason
        raise ResourceError(f"Ray Serve could not start {name}: {_reason(name, exc)} (replica "
                            "logs: /tmp/ray/session_latest/logs/serve/)") from None
    log.info("serving", extra={
        "url": f"http://{settings.host}:{settings.port}{settings.ray.route_prefix}",
        "ray": ray.get_runtime_context().gcs_address, "models": settings.model_names()})


def deployment_reason(name: str) -> str:
    """The last line of the deployment's status message (a replica's own error, e.g. the
    health check's "models not ready: ...", or Ray's "taken more than 30s to be scheduled
    ... Resources required for each replica ..."), or "" where it has none."""
    try:
        message = serve.status().applications[name].deployments[name].message
    except (KeyError, RuntimeError):
        message = ""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _reason(name: str, exc: BaseException) -> str:
    """Why the deployment failed: :func:`deployment_reason`, else the exception's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return deployment_reason(name) or (lines[-1] if lines else type(exc).__name__)

