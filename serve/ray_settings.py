"""The ``ray:`` section of the settings: how the server runs as a Ray Serve application.

Plain data (no ``ray`` import), so a repository file with a ``ray:`` section validates, and a
Serve config file is written, on a machine without Ray. :mod:`serve.ray_app` turns these into
Ray Serve's deployment options; docs/deploy.md ("Ray Serve") shows them in use.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from irpe.errors import MissingFile

from .ray_address import check_address

__all__ = ["RETRY_ON", "RayAutoscaling", "RaySettings"]

# HAProxy's retry-on for the HAProxy ingress: nothing sent, or the replica closed (or garbled)
# the connection without an answer; never a 5xx the server chose to send (its backpressure)
RETRY_ON = "conn-failure empty-response junk-response"


class RayAutoscaling(BaseModel):
    """Ray Serve's replica autoscaler, by ongoing requests per replica (its own names)."""

    model_config = ConfigDict(extra="forbid")
    min_replicas: int = Field(1, ge=1, description="replicas kept however idle (>= 1: a "
                              "replica loads its models before it serves, seconds)")
    max_replicas: int = Field(2, ge=1)
    target_ongoing_requests: float = Field(
        4.0, gt=0, description="ongoing requests per replica the autoscaler aims at")
    upscale_delay_s: float = Field(10.0, ge=0, description="load above target this long "
                                   "before a replica is added")
    downscale_delay_s: float = Field(60.0, ge=0, description="load below target this long "
                                     "before a replica is removed (it drains first)")
    look_back_period_s: float = Field(
        30.0, gt=0, description="window the autoscaler averages the replicas' reports of "
        "ongoing requests over (longer than their period, Ray's "
        "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S, 10 s unless set)")

    @model_validator(mode="after")
    def _ordered(self) -> "RayAutoscaling":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is above max_replicas "
                             f"{self.max_replicas}")
        return self


class RaySettings(BaseModel):
    """One Ray Serve deployment whose replicas each serve every configured model: the app of
    ``irpe serve`` (routes, batching, errors, metrics) with Ray's proxy in front."""

    model_config = ConfigDict(extra="forbid")
    address: Optional[str] = Field(
        None, description="irpe serve --ray: the Ray cluster to deploy to: null starts a "
        "local one for the life of the command, 'auto' finds the cluster this machine is part "
        "of, 'ray://HOST:10001' a remote one (Ray Client); RAY_ADDRESS wins when set")
    application: str = Field("irpe", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
                             description="Serve application name")
    route_prefix: str = Field("/", pattern=r"^/", description="where the app's routes start "
                              "on Ray's HTTP proxy")
    num_replicas: int = Field(1, ge=1, description="replicas without autoscaling")
    autoscaling: Optional[RayAutoscaling] = Field(None, description="replicas between "
                                                  "min_replicas and max_replicas by load")
    num_cpus: float = Field(1.0, gt=0, description="CPUs one replica reserves; its threads "
                            "default to this (rounded down, at least 1) when threads is 0")
    num_gpus: float = Field(0.0, ge=0, description="GPUs one replica reserves (a fraction "
                            "shares one GPU); models on cuda need > 0")
    max_ongoing_requests: int = Field(
        32, ge=1, description="requests one replica holds at a time; Ray's proxy queues the "
        "rest (each model's max_queue_size still answers 503 beyond it)")
    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] = Field(
        "EveryNode", description="where Ray runs its HTTP proxy: on every node (a load "
        "balancer in front), on the head node only, or none (handles only)")
    ingress: Literal["proxy", "haproxy"] = Field(
        "proxy", description="HTTP into the replicas, on a Ray this command starts: Ray's "
        "proxy (a Python process that forwards each request to a replica), or Ray Serve's "
        "HAProxy ingress (HAProxy, the Debian binary on PATH, balancing over the replicas' own "
        "HTTP servers: ~4x the proxy's requests per second here, and a request on a replica "
        "lost mid-way is replayed on another, since every route is idempotent; but Ray's "
        "HAProxy also listens on all interfaces for its stats and metrics, :8404 and :9101; "
        "docs/deploy.md). An existing cluster's ingress is set where it starts (node_env)")
    haproxy_deregister_s: float = Field(
        2.0, ge=0, le=3600, description="ingress haproxy: seconds a stopping replica stays "
        "reachable before it refuses connections (Ray's "
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S, 30 s by default, meant for external "
        "balancers in front of the replicas); Ray's own HAProxy drops a removed replica in "
        "~0.6 s here and retries a refused connection elsewhere, so the 30 s only delayed "
        "every stop (the command's drain_grace_s comes first)")
    deploy_timeout_s: float = Field(
        300.0, gt=0, le=86400, description="irpe serve --ray: seconds the deployment may take "
        "to run (replicas scheduled, models loaded); longer fails with Ray's reason in one line "
        "and deletes it (a Ray the command starts is checked for the replicas' CPUs and GPUs "
        "before)")
    proxy_ready_timeout_s: float = Field(
        30.0, ge=1, le=3600, description="irpe serve --ray, a Ray it starts: seconds Ray Serve "
        "waits for a starting HTTP proxy to answer its readiness check (Ray's "
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S, 5 s by default, times the restarts); three "
        "misses and Ray kills the proxy, so on a busy machine the 5 s failed the start (ready in "
        "a few seconds when idle)")
    health_check_period_s: float = Field(2.0, gt=0, description="how often Ray asks a replica "
                                         "whether every model is ready")
    health_check_timeout_s: float = Field(10.0, gt=0)

    @field_validator("address")
    @classmethod
    def _address(cls, value: Optional[str]) -> Optional[str]:
        return check_address(value)

    @model_validator(mode="after")
    def _replicas(self) -> "RaySettings":
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("num_replicas and autoscaling exclude each other (autoscaling "
                             "sets min_replicas / max_replicas)")
        return self

    def deployment_options(self, shutdown_timeout_s: float) -> Dict[str, Any]:
        """Ray Serve's options of the deployment (``Deployment.options`` / the ``deployments``
        entry of a Serve config file). A stopping replica is drained by Ray itself: routed
        nothing more, then given ``shutdown_timeout_s`` (the server's) for requests in flight
        before its models stop."""
        options: Dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
            "max_ongoing_requests": self.max_ongoing_requests,
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
            "graceful_shutdown_wait_loop_s": 0.2,
            "graceful_shutdown_timeout_s": shutdown_timeout_s,
        }
        if self.autoscaling is None:
            options["num_replicas"] = self.num_replicas
        else:
            options["autoscaling_config"] = self.autoscaling.model_dump()
        return options

    def node_env(self) -> Dict[str, str]:
        """Environment of the Ray processes this command starts (set before Ray starts,
        inherited by every node it starts; on a cluster started elsewhere, set at ``ray
        start``): the ``ingress`` and how long a starting proxy may take. HAProxy must be
        installed (``apt-get install haproxy``) for ``ingress: haproxy``."""
        ready = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": f"{self.proxy_ready_timeout_s:g}"}
        if self.ingress == "proxy":
            return {**ready, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
                    "RAY_SERVE_ENABLE_HA_PROXY": "0"}
        binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
        if binary is None:
            raise MissingFile("ray.ingress haproxy needs the haproxy binary (apt-get install "
                              "haproxy), found on neither PATH nor /usr/sbin")
        # every route of the server is idempotent (inference is a function of its input), so
        # HAProxy may replay a request whose replica closed without an answer (a lost node)
        return {**ready, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                "RAY_SERVE_ENABLE_HA_PROXY": "1",
                "RAY_SERVE_HAPROXY_BINARY_PATH": binary,
                "RAY_SERVE_HAPROXY_NBTHREAD": str(min(4, os.cpu_count() or 1)),
                "RAY_SERVE_HAPROXY_RETRY_ON": RETRY_ON,
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": f"{self.haproxy_deregister_s:g}"}

    def replica_threads(self) -> int:
        """Inference threads of a replica when the server's ``threads`` is 0 (its CPUs)."""
        return max(1, int(self.num_cpus))
