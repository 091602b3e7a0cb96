"""Run a real server in a background thread on 127.0.0.1 (tests, HTTP benchmarks)."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from .config import ServeSettings

__all__ = ["running_server", "wait_ready"]


@contextlib.contextmanager
def running_server(settings: ServeSettings, ready: bool = True,
                   timeout_s: float = 60.0) -> Iterator[str]:
    """Serve ``settings`` on a free port; yields the base URL, stops (draining) on exit."""
    import uvicorn
    from .app import create_app
    from .net import listen_socket
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_config=None,
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: server.started or not thread.is_alive(), timeout_s, "server start")
        if not thread.is_alive():
            raise RuntimeError("server thread exited during startup")
        if ready:
            wait_ready(url, timeout_s)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    """Poll /v2/health/ready until 200."""
    import httpx
    _wait(lambda: httpx.get(f"{url}/v2/health/ready").status_code == 200, timeout_s,
          "readiness")


def _wait(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s:g} s")
        time.sleep(0.05)
