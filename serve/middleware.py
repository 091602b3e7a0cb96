"""ASGI middleware: request ids, request log, HTTP metrics, in-flight gauge, body size limit."""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Iterator, Optional

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import CLIENT_CLOSED_REQUEST, ServeError
from .logs import request_id
from .metrics import Metrics
from .tracing import RequestTrace, Tracing

__all__ = ["ObserveMiddleware", "BodyLimitMiddleware", "BodyTooLarge"]

log = logging.getLogger("irpe.serve.access")
_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class BodyTooLarge(ServeError):
    """A streamed body that grew past the limit (413)."""


class ObserveMiddleware:
    """Assign X-Request-ID, log each request, count it by route template and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics, tracing: Optional[Tracing] = None
                 ) -> None:
        self.app, self.metrics, self.tracing = app, metrics, tracing  # None: not traced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _ID.match(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        status, start = 500, time.perf_counter()
        trace = None if self.tracing is None else self.tracing.begin(scope)
        if trace is not None:
            receive, send = traced_receive(trace, receive), traced_send(trace, send)

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = list(message.get("headers", [])) + [
                    (b"x-request-id", rid.encode())]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.in_flight.dec()
            route = self._record(scope, status, time.perf_counter() - start)
            if trace is not None:
                trace.finish(scope["method"], route, status)
            request_id.reset(token)

    def _record(self, scope: Scope, status: int, seconds: float) -> str:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        self.metrics.requests.labels(route, scope["method"], str(status)).inc()
        if status == CLIENT_CLOSED_REQUEST:
            self.metrics.disconnected.labels(route, scope["method"]).inc()
        self.metrics.latency.labels(route).observe(seconds)
        log.info("request", extra={"method": scope["method"], "path": scope["path"],
                                   "route": route, "status": status,
                                   "duration_ms": round(seconds * 1000, 2),
                                   "client": (scope.get("client") or ("-",))[0]})
        return route


def traced_receive(trace: RequestTrace, receive: Receive) -> Receive:
    """``receive`` counting the request body's bytes into ``trace``."""
    async def counted() -> Message:
        message = await receive()
        trace.bytes_in += len(message.get("body", b""))
        return message
    return counted


def traced_send(trace: RequestTrace, send: Send) -> Send:
    """``send`` counting the response body's bytes into ``trace``; its last body message ends
    the request's ``encode_response`` span."""
    async def counted(message: Message) -> None:
        if message["type"] == "http.response.body":
            trace.bytes_out += len(message.get("body", b""))
            if not message.get("more_body", False):
                trace.body_sent(time.time_ns())
        await send(message)
    return counted


class BodyLimitMiddleware:
    """413 for bodies over ``limit`` bytes (declared by Content-Length or streamed).

    The rest of the body is read and discarded first (up to ``drain`` bytes): closing a socket
    with unread data resets the connection, and the client would never see the 413. A client
    that sent ``Expect: 100-continue`` has sent no body yet: an over-limit declaration is
    refused at once, and any answer given before the body was asked for closes the connection
    (the client will not send that body, so the connection cannot carry another request).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit
        self.drain = max(4 * limit, 16 << 20)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        expects = headers.get(b"expect", b"").lower() == b"100-continue"
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            if not expects and length.isdigit() and int(length) <= self.drain:
                await self._discard(receive, 0)
            _find_route(scope)  # refused before routing: counted and logged under its route
            return await _reject(send, self._message(), close=expects)
        received, asked = 0, False

        async def limited_receive() -> Message:
            nonlocal received, asked
            asked = True
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    if message.get("more_body", False):
                        await self._discard(receive, received)
                    raise BodyTooLarge(413, self._message())
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and expects and not asked:
                message["headers"] = list(message.get("headers", [])) + [(b"connection",
                                                                           b"close")]
            await send(message)

        await self.app(scope, limited_receive, closing_send)

    async def _discard(self, receive: Receive, seen: int) -> None:
        while seen <= self.drain:
            message = await receive()
            if message["type"] != "http.request":
                return
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def _message(self) -> str:
        return f"request body is over the limit of {self.limit} bytes"


def _find_route(scope: Scope) -> Optional[object]:
    """Set ``scope["route"]`` to the app's route that fully matches the request, as the router
    would (ObserveMiddleware labels metrics and logs with its path); None when none does."""
    for route in _leaf_routes(getattr(scope.get("app"), "router", None)):
        match, child = route.matches(scope)
        if match is Match.FULL:
            scope["route"] = child.get("route", route)
            return scope["route"]
    return None


def _leaf_routes(router: object) -> Iterator[BaseRoute]:
    """The routes of ``router``, those of included routers in their place (FastAPI keeps an
    included router as one route holding the ``original_router``)."""
    for route in getattr(router, "routes", []):
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner)
        else:
            yield route


async def _reject(send: Send, message: str, close: bool = False) -> None:
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": body})
