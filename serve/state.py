"""What the routes share: settings, served models, metrics; lookup and auth dependencies."""
from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Annotated, Dict, Optional

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .config import ServeSettings
from .errors import ServeError, unavailable
from .metrics import Metrics
from .model import ServedModel

__all__ = ["AppState", "app_state", "require_token", "get_model", "default_model"]

_bearer = HTTPBearer(auto_error=False, description="required when the server has an auth "
                     "token (IRPE_SERVE_AUTH_TOKEN)")


@dataclass
class AppState:
    """Server-wide state stored on ``app.state.irpe``."""

    settings: ServeSettings
    models: Dict[str, ServedModel]
    metrics: Metrics = field(default_factory=Metrics)
    draining: bool = False  # SIGTERM: readiness 503, answers say Connection: close (serve.drain)
    stopping: bool = False  # models stopping (lifespan shutdown): inference 503 too

    def not_ready(self) -> Optional[str]:
        """Why the server is not ready, or None when every model is. Draining is not ready
        at once, so load balancers stop routing here while requests are still answered."""
        if self.draining or self.stopping:
            return "server is shutting down"
        waiting = [f"{m.name} ({m.state})" for m in self.models.values() if not m.ready]
        return f"models not ready: {', '.join(waiting)}" if waiting else None

    def model(self, name: str, version: Optional[str] = None) -> ServedModel:
        """The served model ``name``; 404 naming the available ones otherwise, or for a
        ``version`` (v2 paths) other than the single version "1" every model has."""
        if name not in self.models:
            raise ServeError(404, f"unknown model {name!r}; available: "
                             f"{', '.join(self.models) or 'none'}")
        _check_version(name, version)
        return self.models[name]

    def default(self, task: str) -> ServedModel:
        """Target of the /v1/classify and /v1/detect shortcuts."""
        s = self.settings
        name = s.default_classifier if task == "classification" else s.default_detector
        if name is not None:
            return self.model(name)
        for m in self.models.values():
            if m.task == task:
                return m
        raise ServeError(404, f"no {task} model is served")


def app_state(request: Request) -> AppState:
    """The AppState of the app handling ``request``."""
    return request.app.state.irpe


async def require_token(
        request: Request,
        credentials: Annotated[Optional[HTTPAuthorizationCredentials], Depends(_bearer)]) -> None:
    """401 unless the bearer token equals the configured one (constant-time compare). Async: a
    plain def dependency would run in a worker thread per request, where requests overtake each
    other in the race for the GIL (the tail-latency fix of docs/serve.md)."""
    token = app_state(request).settings.auth_token
    if token is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise ServeError(401, "missing or invalid bearer token",
                         {"WWW-Authenticate": "Bearer"})


def get_model(request: Request, name: str, version: Optional[str] = None) -> ServedModel:
    """The named model (and version), ready for inference (404 / 503): a request's one
    readiness check."""
    return _ready(app_state(request), name, version)


def default_model(request: Request, task: str) -> ServedModel:
    """The /v1/classify or /v1/detect target, ready for inference (404 / 503)."""
    state = app_state(request)
    return _ready(state, state.default(task).name)


def _ready(state: AppState, name: str, version: Optional[str] = None) -> ServedModel:
    if state.stopping:
        raise unavailable("server is shutting down")
    model = state.model(name)
    model.check_ready()
    _check_version(name, version)  # after readiness, the order /v2 answers in
    return model


def _check_version(name: str, version: Optional[str]) -> None:
    """Every model has the single version "1" (v2 paths)."""
    if version is not None and version != "1":
        raise ServeError(404, f"model {name} has no version {version!r} (only \"1\")")
