"""SIGTERM drains the way nginx and Envoy drain, so no keep-alive client loses a request.

uvicorn's own shutdown closes the listener and every idle keep-alive connection at once and
turns in-flight connections non-keep-alive without telling the client; readiness never says
503 over HTTP, so a load balancer keeps routing to a server that resets its connections
(issue 42: 11-15 requests per drain whose fate the client cannot know). Here, from the signal:

1. **At once**: ``AppState.draining``: ``/v2/health/ready`` answers 503 ("server is shutting
   down") and every response written from now on carries ``Connection: close``
   (:class:`CloseWhileDraining`): a keep-alive client learns with its next answer that the
   connection ends, and reconnects (behind a load balancer: to another replica).
2. **For** ``drain_grace_s``: the listener still accepts and every request is served, so
   health checks see the 503 and the balancer stops routing here before anything is refused.
3. **After the grace**: connections already in the listen backlog are accepted (closing a
   listening socket resets them), the listener closes (new connections refused), connections
   idle for :data:`IDLE_CLOSE_S` close (a request whose bytes are on their way is not cut),
   in-flight requests get ``shutdown_timeout_s`` to finish (then they are cancelled), and the
   models stop (the app's lifespan: queued batches run first).

A second signal ends the grace at once; a second SIGINT also stops waiting for requests
(uvicorn's force exit). SIGINT alone (Ctrl-C in a terminal) skips the grace. The process exits
within ``drain_grace_s + shutdown_timeout_s`` plus the models' stop.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType
from typing import Any, Callable, Dict, List, Optional

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .config import ServeSettings
from .server import AnnouncingServer
from .state import AppState

__all__ = ["CloseWhileDraining", "DrainingServer", "IDLE_CLOSE_S"]

log = logging.getLogger("irpe.serve")

IDLE_CLOSE_S = 0.5  # after the grace: a connection idle this long closes (none arrives midway)
_POLL_S = 0.05


class CloseWhileDraining:
    """ASGI wrapper, outside every middleware: while ``draining()`` is true each response
    start carries ``Connection: close`` (any other Connection value replaced). uvicorn's h11
    protocol then closes the connection once that response is written."""

    def __init__(self, app: ASGIApp, draining: Callable[[], bool]) -> None:
        self.app, self.draining = app, draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and self.draining():
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"connection"]
                message = {**message, "headers": headers + [(b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing_send)


class DrainingServer(AnnouncingServer):
    """uvicorn's server with the drain of the module docstring in place of its shutdown."""

    def __init__(self, config: uvicorn.Config, models: List[str], state: AppState,
                 grace_s: float, timeout_s: float) -> None:
        super().__init__(config, models)
        self.state, self.grace_s, self.timeout_s = state, grace_s, timeout_s
        self.drain_since: Optional[float] = None
        self.grace_end = 0.0
        self.skip_grace = False

    @classmethod
    def for_app(cls, app: FastAPI, settings: ServeSettings) -> "DrainingServer":
        """The server of ``irpe serve``: the app wrapped in :class:`CloseWhileDraining`, on
        uvicorn's h11 protocol (the drain reads h11's connection state to tell an idle
        keep-alive connection from one with a request on its way)."""
        state: AppState = app.state.irpe
        config = uvicorn.Config(CloseWhileDraining(app, lambda: state.draining), http="h11",
                                log_config=None, access_log=False, lifespan="on")
        return cls(config, settings.model_names(), state, settings.drain_grace_s,
                   settings.shutdown_timeout_s)

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        """Signal handler (main thread, between two bytecodes of the event loop: plain
        assignments only). The first signal starts the drain at once, so readiness is 503
        before uvicorn's main loop even notices; another one ends the grace."""
        if self.drain_since is None:
            self._begin(self.grace_s if sig == signal.SIGTERM else 0.0)
        else:
            self.skip_grace = True
        super().handle_exit(sig, frame)

    def _begin(self, grace_s: float) -> None:
        self.state.draining = True
        self.drain_since = time.monotonic()
        self.grace_end = self.drain_since + grace_s

    async def shutdown(self, sockets: Optional[List[socket.socket]] = None) -> None:
        """Grace (serving on), listener closed, idle connections closed, in-flight requests
        finished or cancelled at the deadline, then the lifespan's shutdown (models stop)."""
        if self.drain_since is None:  # asked to exit in code, not by a signal: no grace
            self._begin(0.0)
        conns, tasks = self.server_state.connections, self.server_state.tasks
        log.info("draining", extra={"grace_s": round(self.grace_end - time.monotonic(), 2),
                                    "connections": len(conns), "in_flight": len(tasks)})
        idle_since: Dict[Any, float] = {}
        listening, deadline = True, float("inf")
        while not self.force_exit:
            now = time.monotonic()
            if listening and (now >= self.grace_end or self.skip_grace):
                listening, deadline = False, now + self.timeout_s
                await self._stop_listening(sockets or [])
            _close_idle(conns, idle_since, now, closing=not listening)
            if not listening and not conns and not tasks:
                break
            if now >= deadline:
                log.error("drain timeout: cancelling requests", extra={
                    "in_flight": len(tasks), "shutdown_timeout_s": self.timeout_s})
                for task in list(tasks):
                    task.cancel(msg="drain timeout (shutdown_timeout_s)")
                for conn in list(conns):
                    conn.shutdown()
                break
            await asyncio.sleep(_POLL_S)
        log.info("drained", extra={"seconds": round(time.monotonic() - (self.drain_since or 0),
                                                    2), "connections_left": len(conns)})
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _stop_listening(self, sockets: List[socket.socket]) -> None:
        """Close the listener without resetting the connections in its backlog: they are
        accepted first and served like the others (their answers say Connection: close)."""
        loop = asyncio.get_running_loop()
        waiting = [conn for sock in sockets for conn in _accept_backlog(sock)]
        for server in getattr(self, "servers", []):
            server.close()  # no await between the last accept and this close

        # uvicorn types the class as asyncio.Protocol's; its h11 protocol takes these keywords
        protocol_class: Any = self.config.http_protocol_class

        def protocol() -> asyncio.Protocol:
            return protocol_class(config=self.config, server_state=self.server_state,
                                  app_state=self.lifespan.state, _loop=loop)

        for conn in waiting:
            try:
                await loop.connect_accepted_socket(protocol, conn)
            except OSError:  # the client left already
                conn.close()
        log.info("listener closed", extra={"from_backlog": len(waiting),
                                           "connections": len(self.server_state.connections),
                                           "in_flight": len(self.server_state.tasks)})


def _accept_backlog(sock: socket.socket) -> List[socket.socket]:
    """Every connection waiting in ``sock``'s accept queue (non-blocking listener)."""
    accepted: List[socket.socket] = []
    while True:
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError, OSError):
            return accepted
        conn.setblocking(False)
        accepted.append(conn)


def _close_idle(conns: Any, idle_since: Dict[Any, float], now: float, closing: bool) -> None:
    """Track when each connection became idle; once ``closing`` (after the grace), close
    those idle for IDLE_CLOSE_S and make the others close after their response."""
    for conn in list(conns):
        if not isinstance(conn, H11Protocol):  # not h11 (another protocol): uvicorn's way
            if closing:
                conn.shutdown()
            continue
        if _idle(conn):
            since = idle_since.setdefault(conn, now)
            if closing and now - since >= IDLE_CLOSE_S:
                conn.shutdown()  # idle: h11 ConnectionClosed, transport closed
            continue
        idle_since.pop(conn, None)
        if closing and conn.cycle is not None and not conn.cycle.response_complete:
            conn.cycle.keep_alive = False  # its response started before the drain began


def _idle(conn: H11Protocol) -> bool:
    """No request in progress and no byte of the next one received."""
    import h11
    if conn.cycle is not None and not conn.cycle.response_complete:
        return False
    data, _closed = conn.conn.trailing_data
    return conn.conn.their_state is h11.IDLE and not data
