"""A real OTLP/HTTP trace receiver on loopback: what an OpenTelemetry Collector's ``otlp``
receiver does with ``POST /v1/traces`` (protobuf ``ExportTraceServiceRequest``), kept in memory.

Used by tests/test_serve_tracing.py (in a thread: every span decoded with opentelemetry-proto)
and by ``python -m benchmarks.serve_load --tracing`` (``python -m benchmarks.otlp_receiver``,
a process of its own that stores the bodies and decodes them only when it stops, so the
receiver costs the measured machine little while the load runs). Needs opentelemetry-proto
(the ``trace`` extra brings it).
"""
from __future__ import annotations

import argparse
import gzip
import json
import signal
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["OtlpReceiver", "decode_spans"]

PATH = "/v1/traces"


def _hex(raw: bytes) -> str:
    return raw.hex()


def _value(v: Any) -> Any:
    """An OTLP AnyValue as Python."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def decode_spans(body: bytes) -> List[Dict[str, Any]]:
    """The spans of one ExportTraceServiceRequest body, flat: name, ids (hex), parent_span_id
    ("" for a root), start_ns / end_ns, kind, status code, attributes, links (trace_id,
    span_id), service (the resource's service.name)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append({
                    "name": s.name, "trace_id": _hex(s.trace_id), "span_id": _hex(s.span_id),
                    "parent_span_id": _hex(s.parent_span_id), "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano, "kind": s.kind, "status": s.status.code,
                    "attributes": {a.key: _value(a.value) for a in s.attributes},
                    "links": [(_hex(ln.trace_id), _hex(ln.span_id)) for ln in s.links],
                    "service": resource.get("service.name"), "scope": ss.scope.name})
    return spans


def _handler(receiver: "OtlpReceiver") -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's requests.Session uses

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            coding = (self.headers.get("content-encoding") or "").lower()
            if coding == "gzip":
                body = gzip.decompress(body)
            elif coding == "deflate":
                body = zlib.decompress(body)
            ok = self.path == PATH and \
                self.headers.get("content-type", "").startswith("application/x-protobuf")
            if ok:
                receiver.received(body)
            self.send_response(200 if ok else 404)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass
    return Handler


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` serves ``r.url`` (``http://127.0.0.1:PORT/v1/traces``) in a
    thread; ``r.spans()`` decodes what arrived (``decode=False``: bodies kept, decoded on
    ``spans()``)."""

    def __init__(self, decode: bool = True) -> None:
        self.decode, self.bodies, self.requests = decode, [], 0
        self._spans: List[Dict[str, Any]] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{PATH}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="otlp-receiver")

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self, body: bytes) -> None:
        spans = decode_spans(body) if self.decode else None
        with self._lock:
            self.requests += 1
            if spans is None:
                self.bodies.append(body)
            else:
                self._spans.extend(spans)

    def spans(self) -> List[Dict[str, Any]]:
        """Every span received so far, in arrival order."""
        with self._lock:
            bodies, self.bodies = self.bodies, []
            for body in bodies:
                self._spans.extend(decode_spans(body))
            return list(self._spans)

    def wait_for(self, count: int, timeout_s: float = 30.0) -> List[Dict[str, Any]]:
        """The spans once at least ``count`` arrived; TimeoutError naming how many did."""
        deadline = time.monotonic() + timeout_s
        while len(spans := self.spans()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(spans)} of {count} spans within {timeout_s:g} s")
            time.sleep(0.05)
        return spans


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Receive until SIGTERM / SIGINT; print the URL first, a JSON summary last."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.otlp_receiver", description=__doc__)
    p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with OtlpReceiver(decode=False) as receiver:
        print(receiver.url, flush=True)
        stop.wait()
        spans = receiver.spans()
    names: Dict[str, int] = {}
    for s in spans:
        names[s["name"]] = names.get(s["name"], 0) + 1
    json.dump({"requests": receiver.requests, "spans": len(spans), "by_name": names},
              sys.stdout)
    print(flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
