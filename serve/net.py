"""The listening socket: TCP explicitly, so every accepted connection gets TCP_NODELAY.

asyncio sets TCP_NODELAY on accepted connections only when the listening socket's protocol is
IPPROTO_TCP; ``socket.socket(family)`` leaves it 0, and then Nagle's algorithm + the client's
delayed ACK stall each keep-alive response (uvicorn writes head and body separately) by ~40 ms.
"""
from __future__ import annotations

import socket

from irpe.errors import ResourceError

__all__ = ["listen_socket"]


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn (port 0 = any free port); ResourceError (an OSError)
    names host:port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ResourceError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock
