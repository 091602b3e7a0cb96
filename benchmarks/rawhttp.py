"""A lean HTTP/1.1 keep-alive POST client on asyncio streams, for load generation.

httpx spent ~8 ms of CPU per request under open-loop overload here, so one core could not
offer even 100 req/s. This client sends one prebuilt
request per call over a pool of keep-alive connections and parses only the status line,
Content-Length and the Connection header: an order of magnitude cheaper per request.
"""
from __future__ import annotations

import asyncio
import time
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

__all__ = ["LeanClient", "Lost"]

Conn = Tuple[asyncio.StreamReader, asyncio.StreamWriter, float]  # reader, writer, last used


class Lost(ConnectionError):
    """No HTTP answer: the connection failed, closed or sent a malformed response."""


class LeanClient:
    """POST ``body`` to ``path`` on ``url`` over at most ``max_connections`` connections
    (``async with client.slots`` around ``post``); idle ones expire after ``keepalive_s``
    (below the server's keep-alive timeout, so the client never reuses one being closed)."""

    def __init__(self, url: str, path: str, body: bytes, headers: Dict[str, str],
                 keepalive_s: float = 1.0, max_connections: int = 256) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.request = (f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}"
                        f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        self.keepalive_s = keepalive_s
        self.idle: List[Conn] = []
        self.slots = asyncio.Semaphore(max_connections)  # callers wait for a free connection

    async def post(self) -> Tuple[int, bytes]:
        """One request -> (status, body); raises :class:`Lost` when no answer came back."""
        reader, writer = await self._connection()
        try:
            writer.write(self.request)
            head = await reader.readuntil(b"\r\n\r\n")
            status, length, close = _parse_head(head)
            body = await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as exc:
            writer.close()
            raise Lost(f"{type(exc).__name__}: {exc}") from None
        if close:
            writer.close()
        else:
            self.idle.append((reader, writer, time.monotonic()))
        return status, body

    async def _connection(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        now = time.monotonic()
        while self.idle:
            reader, writer, used = self.idle.pop()
            if now - used < self.keepalive_s and not reader.at_eof():
                return reader, writer
            writer.close()
        try:
            return await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise Lost(f"connect: {exc}") from None

    async def aclose(self) -> None:
        """Close every idle connection."""
        for _, writer, _ in self.idle:
            writer.close()
        self.idle.clear()


def _parse_head(head: bytes) -> Tuple[int, int, bool]:
    """(status, Content-Length, server closes) from a response head."""
    lines = head.decode("latin-1").split("\r\n")
    version, status = lines[0].split(" ", 2)[:2]
    fields = dict(line.lower().split(":", 1) for line in lines[1:] if ":" in line)
    close = fields.get("connection", "").strip() == "close" or version == "HTTP/1.0"
    if "content-length" not in fields:
        raise ValueError(f"response without Content-Length: {lines[0]}")
    return int(status), int(fields["content-length"]), close
