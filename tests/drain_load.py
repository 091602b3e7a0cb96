"""Keep-alive client load for the drain and rolling-update tests.

N clients, each an ``httpx.Client`` of its own (one keep-alive connection at a time), POST the
same request in a loop and record every outcome: the status, or the transport error's class
name, whether the response said ``Connection: close``, and whether the client had already been
told ``Connection: close`` before it sent this request. A request that ends in a reset or a
protocol error although nobody had told its client that the server is going away is one whose
fate the client cannot know: the drain must leave none of those."""
from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional

import httpx

# transport errors after which the client cannot tell whether the server ran the request
UNKNOWN = ("ReadError", "RemoteProtocolError", "WriteError", "ReadTimeout", "WriteTimeout",
           "CloseError")


@dataclass
class Outcome:
    """One request of one client."""

    client: int
    sent: float    # time.monotonic() before the request was sent
    done: float
    result: str    # "200", "503", ... or the httpx exception class name
    close: bool    # the response carried Connection: close
    told: bool     # an earlier response to this client carried Connection: close


class KeepAliveLoad:
    """``clients`` threads POSTing ``body`` to ``url`` in a loop until :meth:`stop`."""

    def __init__(self, url: str, body: bytes, headers: Dict[str, str], clients: int,
                 timeout_s: float = 30.0) -> None:
        self.url, self.body, self.headers = url, body, headers
        self.timeout_s = timeout_s
        self.outcomes: List[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(clients)]

    def start(self) -> "KeepAliveLoad":
        for t in self._threads:
            t.start()
        return self

    def count(self, result: str = "200") -> int:
        """Outcomes so far with ``result``."""
        with self._lock:
            return sum(o.result == result for o in self.outcomes)

    def stop(self) -> List[Outcome]:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)
        return list(self.outcomes)

    def _run(self, index: int) -> None:
        told = False
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        with httpx.Client(timeout=self.timeout_s, limits=limits) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                close = False
                try:
                    r = client.post(self.url, content=self.body, headers=self.headers)
                    result = str(r.status_code)
                    close = "close" in r.headers.get("connection", "").lower()
                except httpx.HTTPError as exc:
                    result = type(exc).__name__
                with self._lock:
                    self.outcomes.append(Outcome(index, sent, time.monotonic(), result, close,
                                                 told))
                told = told or close
                if result == "ConnectError":  # refused: the server is gone (or not back yet)
                    self._stop.wait(0.02)


def summary(outcomes: List[Outcome], since: Optional[float] = None) -> Dict[str, int]:
    """Counts by result of the requests sent at or after ``since``; ``unknown_untold``: resets
    and protocol errors of requests whose client had not been told Connection: close."""
    chosen = [o for o in outcomes if since is None or o.sent >= since]
    counts = Counter(o.result for o in chosen)
    out = dict(sorted(counts.items()))
    out["unknown_untold"] = sum(o.result in UNKNOWN and not o.told for o in chosen)
    out["unknown"] = sum(o.result in UNKNOWN for o in chosen)
    out["close"] = sum(o.close for o in chosen)
    return out


def percentile_ms(samples: List[float], q: float = 0.5) -> float:
    """The ``q`` quantile of seconds, in milliseconds."""
    if q == 0.5:
        return statistics.median(samples) * 1000
    return statistics.quantiles(samples, n=100)[int(q * 100) - 1] * 1000
