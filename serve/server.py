"""uvicorn's server, announcing its URL only once the listening socket accepts connections
(the drain on SIGTERM: serve.drain.DrainingServer, a subclass)."""
from __future__ import annotations

import logging
import socket
from typing import List, Optional

import uvicorn

__all__ = ["AnnouncingServer", "socket_url"]

log = logging.getLogger("irpe.serve")


def socket_url(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class AnnouncingServer(uvicorn.Server):
    """Logs "serving" (URL, models) after startup: lifespan run, asyncio server listening.

    A client that connects as soon as it reads that line is never refused (issue: the line used
    to be written after bind, before uvicorn called listen)."""

    def __init__(self, config: uvicorn.Config, models: List[str]) -> None:
        super().__init__(config)
        self.models = models

    async def startup(self, sockets: Optional[List[socket.socket]] = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:
            log.info("serving", extra={"url": socket_url(sockets[0]), "models": self.models})
