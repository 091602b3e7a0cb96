"""``irpe serve --ray`` in the foreground: Ray started (or joined), the application deployed,
served until SIGINT / SIGTERM, then drained and stopped; every stage answers the signals.

Stages (issue 50, defect 1): while Ray starts and while the deployment starts, a signal stops
the command at once: what was deployed is deleted, the Ray it started is shut down (its
processes with it) and the command exits with one line (status 2). Before deploying to a Ray it
started, the resources the replicas ask for are checked against that Ray (one line, exit 2); on
any cluster a deploy not running within ``ray.deploy_timeout_s`` fails with Ray's reason in one
line. While serving, a signal drains: the application is deleted (Ray drains its replicas).
"""
from __future__ import annotations

import logging
import os
import re
import signal
import threading
from types import FrameType
from typing import Any, Dict, Optional, Tuple

import ray
from ray import serve
from ray.exceptions import RayError

from irpe.errors import CLIError, ResourceError

from .app import build_models
from .config import ServeSettings
from .launch import Launch
from .metrics import Metrics
from .net import listen_socket
from .ray_address import probe
from .ray_app import DrainFlag, deploy, deployment_reason

__all__ = ["StopRequested", "ray_reason", "run_on_ray"]

log = logging.getLogger("irpe.serve")


class StopRequested(BaseException):
    """Raised in the main thread by a signal before the application serves (a BaseException,
    as KeyboardInterrupt is, so that no ``except Exception`` inside Ray swallows it)."""


class Foreground:
    """The signal handling of one ``irpe serve --ray``: before ``serving`` a signal raises
    StopRequested (the stage's blocking call is abandoned); after it, it sets ``stop``."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.again = threading.Event()  # a second signal: the drain's grace ends at once
        self.serving = False
        self.stage = "starting Ray"
        self.signal_name = ""
        self.previous: Dict[int, Any] = {}

    def install(self) -> None:
        """SIGINT / SIGTERM (and SIGALRM: the deploy timeout) to :meth:`handle`."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self.handle)

    def restore(self) -> None:
        """The handlers from before :meth:`install`."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if not self.signal_name:
            self.signal_name = signal.Signals(signum).name
        if self.stop.is_set():
            self.again.set()
        self.stop.set()
        if not self.serving and self.stage != "cleaning up":
            raise StopRequested(self.signal_name)


def run_on_ray(launch: Launch, settings: ServeSettings) -> int:
    """``irpe serve --ray``: deploy to Ray Serve (a local Ray when no address is set) and stay
    until SIGINT / SIGTERM, then delete the application (its replicas drain) and stop the Ray
    this command started. A signal before it serves: cleaned up, one line, exit 2."""
    build_models(settings, Metrics())  # files, metadata, names: one line before Ray starts
    address, source = _address(settings)
    if address is None:  # Ray's proxy does not report a port in use: one line here instead
        listen_socket(settings.host, settings.port).close()
        os.environ.update(settings.ray.node_env())  # inherited by the nodes it starts
    fg = Foreground()
    fg.install()
    name = settings.ray.application
    try:
        flag = _start(fg, address, source, launch, settings)
        fg.serving, fg.stage = True, "serving"
        while not fg.stop.wait(0.5):
            pass
        _drain(fg, flag, settings)
    except (StopRequested, SystemExit) as exc:  # SystemExit: Ray's own SIGTERM handler
        fg.stage, what = "cleaning up", fg.stage
        _clean_up(address, name)
        raise CLIError(f"stopped by {fg.signal_name or exc} while {what}; "
                       f"{_cleaned(address)}") from None
    except (RayError, TimeoutError) as exc:  # a Ray process died or timed out (Serve's
        # "HTTP proxies not available after 60s" is a TimeoutError): Ray's reason, one line
        fg.stage, what = "cleaning up", fg.stage
        _clean_up(address, name)
        raise ResourceError(f"Ray failed while {what}: {ray_reason(exc)}"
                            f"{_proxy_hint(exc, address, settings)}; {_cleaned(address)}") from None
    except BaseException:
        fg.stage = "cleaning up"
        _clean_up(address, name)
        raise
    finally:
        fg.restore()
    _stop_local(address)
    log.info("stopped; replicas drained")
    return 0


def _address(settings: ServeSettings) -> tuple[Optional[str], str]:
    """The cluster address (RAY_ADDRESS wins over ray.address) and what gave it, probed:
    a bad or unreachable address is one line before Ray is asked."""
    env = os.environ.get("RAY_ADDRESS") or None
    address, source = (env, "RAY_ADDRESS") if env else (settings.ray.address, "ray.address")
    probe(address, source)
    return address, source


def _start(fg: Foreground, address: Optional[str], source: str, launch: Launch,
           settings: ServeSettings) -> Any:
    """Ray (a new local one, never one an earlier run left on record, or ``address``), Serve,
    the resource check of a local Ray, then the deployment within ``deploy_timeout_s``, its
    replicas waiting on a DrainFlag (returned) that this command sets when it drains."""
    try:
        ray.init(address=address or "local", include_dashboard=False,
                 logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ResourceError(f"no Ray cluster at {address} ({source}): {exc}") from None
    except RayError:
        raise
    except Exception as exc:  # noqa: BLE001 (Ray's start-up timeouts are plain exceptions)
        where = f"at {address} ({source})" if address else "here (a local Ray)"
        raise ResourceError(f"Ray did not start {where}: {ray_reason(exc)}") from None
    fg.install()  # again: ray.init sets its own SIGTERM handler (exit at once)
    fg.stage = "starting Ray Serve"
    serve.start(proxy_location=settings.ray.proxy_location,
                http_options={"host": settings.host, "port": settings.port})
    if address is None:
        check_resources(settings)
    fg.stage = f"deploying {settings.ray.application}"
    name = f"irpe-drain-{settings.ray.application}"  # in this driver's own namespace
    flag = DrainFlag.options(name=name).remote()  # type: ignore[attr-defined]
    _deploy_within(launch, settings, (name, ray.get_runtime_context().namespace))
    return flag


def _drain(fg: Foreground, flag: Any, settings: ServeSettings) -> None:
    """The drain of ``irpe serve`` on every replica: readiness 503 and ``Connection: close``
    at once (the DrainFlag), requests served for ``drain_grace_s`` (SIGTERM; SIGINT or a
    second signal skip it) so load balancers notice, then the application deleted: Ray routes
    nothing more to the replicas and gives requests in flight ``shutdown_timeout_s``."""
    name = settings.ray.application
    log.info("draining", extra={"application": name, "signal": fg.signal_name})
    ray.get(flag.set.remote(), timeout=30)
    if fg.signal_name == "SIGTERM":
        fg.again.wait(settings.drain_grace_s)
    serve.delete(name)


def check_resources(settings: ServeSettings) -> None:
    """The replicas' CPUs and GPUs against the Ray this command started: one line (exit 2)
    where they cannot all be placed, instead of Ray waiting for them forever."""
    ray_settings = settings.ray
    replicas = (ray_settings.autoscaling.min_replicas if ray_settings.autoscaling
                else ray_settings.num_replicas)
    have = ray.cluster_resources()
    for what, each in (("CPU", ray_settings.num_cpus), ("GPU", ray_settings.num_gpus)):
        if each * replicas > have.get(what, 0.0) + 1e-9:
            raise CLIError(f"ray: {replicas} replica(s) x num_{what.lower()}s {each:g} need "
                           f"{each * replicas:g} {what}; the local Ray this command started "
                           f"has {have.get(what, 0.0):g} (lower ray.num_{what.lower()}s or "
                           "the replicas, or deploy to a cluster with --ray-address)")


class DeployTimeout(BaseException):
    """SIGALRM: the deployment did not run within ``ray.deploy_timeout_s``."""


def _deploy_within(launch: Launch, settings: ServeSettings,
                   drain_flag: Tuple[str, str]) -> None:
    """:func:`serve.ray_app.deploy`, abandoned after ``ray.deploy_timeout_s`` with Ray's
    reason (replicas not scheduled: what they need, what the cluster has) in one line."""
    timeout = settings.ray.deploy_timeout_s

    def expire(signum: int, frame: Optional[FrameType]) -> None:
        raise DeployTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        deploy(launch, settings, drain_flag)
    except DeployTimeout:
        name = settings.ray.application
        reason = deployment_reason(name) or _unplaced(settings)
        serve.delete(name)
        raise ResourceError(f"Ray Serve did not start {name} within ray.deploy_timeout_s "
                            f"{timeout:g} s: {reason}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _unplaced(settings: ServeSettings) -> str:
    """What a replica asks for beside what the cluster has free (Ray's own message comes only
    after 30 s of waiting)."""
    free = {k: round(v, 2) for k, v in ray.available_resources().items()
            if k in ("CPU", "GPU")}
    return (f"its replicas were not running (each needs CPU {settings.ray.num_cpus:g}, GPU "
            f"{settings.ray.num_gpus:g}; the cluster has free {free})")


def _clean_up(address: Optional[str], name: str) -> None:
    """After a stop or failure: the application deleted from a cluster that outlives this
    command; a Ray it started shut down (its processes, replicas included, with it)."""
    if not ray.is_initialized():
        return
    if address is not None:
        try:
            serve.delete(name)
        except Exception as exc:  # noqa: BLE001 (best effort: the stop is what was asked)
            log.warning("could not delete the application", extra={"error": str(exc)})
    ray.shutdown()


def _stop_local(address: Optional[str]) -> None:
    """After the drain: Serve and the Ray this command started stopped; a cluster's Ray left."""
    if address is None:
        serve.shutdown()
    ray.shutdown()


def ray_reason(exc: BaseException) -> str:
    """Ray's error in one line: the actor it names (``class_name``) and the sentences of its
    message, without the ``key: value`` rows (ids, pid, ip) and tracebacks."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    actor = next((line.partition(":")[2].strip().rpartition(".")[2] for line in lines
                  if line.startswith("class_name:")), "")  # a qualified name's last part
    prose = [line for line in lines if not re.match(r"^[A-Za-z_]+: ", line)
             and not line.startswith(("Traceback", "File ", "^"))]
    text = " ".join(prose[:3]) or type(exc).__name__
    return f"{actor}: {text}" if actor else text


def _proxy_hint(exc: BaseException, address: Optional[str], settings: ServeSettings) -> str:
    """Where Ray killed a proxy that was still starting: the setting that gives it longer."""
    if "ProxyActor" not in str(exc):
        return ""
    if address is None:
        return (f" (Ray Serve gives a starting proxy ray.proxy_ready_timeout_s "
                f"{settings.ray.proxy_ready_timeout_s:g} s, three times; raise it on a busy "
                "machine)")
    return " (on a cluster, RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S is set at `ray start`)"


def _cleaned(address: Optional[str]) -> str:
    return ("deleted what was deployed" if address is not None
            else "stopped the Ray this command started")
