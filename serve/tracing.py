"""OpenTelemetry traces of ``irpe serve`` (docs/tracing.md), off unless asked for.

A traced request is one SERVER span (``POST /v2/models/{name}/infer``: route, model, status,
bytes in and out), continuing a W3C ``traceparent`` when the client sends one, with children
``read_body`` (body read, Content-Encoding undone), ``decode`` (images decoded and resized, or
v2 tensors parsed), ``queue_wait`` (queued until its batch starts), ``inference`` (its batch's
run: batch size, backend, precision, instance) and ``encode_response`` (outputs to the last
body byte handed to the server). A batch is also a span of its own, in a trace of its own,
linked to every request it served; each request's ``inference`` span links back to it.

Turned on by the settings (``tracing``, ``otlp_endpoint``, ``trace_sample_ratio``) or by the
standard ``OTEL_*`` variables alone (``OTEL_TRACES_EXPORTER=otlp``); needs ``pip install
'irpe-deploy[trace]'``. Off, nothing here imports OpenTelemetry: the middleware holds no
tracer, and every hook (:func:`span`, :func:`current`) finds no trace in the request's context
and does nothing. Child spans are made after the fact from ``time.time_ns()`` stamps, so no
OpenTelemetry context crosses the inference thread or the decode pool.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    ContextManager,
    Dict,
    Iterator,
    List,
    MutableMapping,
    Optional,
    Sequence,
)

from irpe.errors import InvalidInput

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from .config import ServeSettings

__all__ = ["Tracing", "RequestTrace", "setup_tracing", "tracing_wanted", "current", "span",
           "record_batch", "log_ids"]

SERVICE = "irpe-serve"  # service.name unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say
EXPORTERS = "OTEL_TRACES_EXPORTER"
DISABLED = "OTEL_SDK_DISABLED"
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
INSTALL = "pip install 'irpe-deploy[trace]'"
UNTRACED = ("/metrics",)  # and /v2/health/*
STOP_TIMEOUT_S = 1.0  # the most a stopping server waits for its last spans to be exported

log = logging.getLogger("irpe.serve")
_current: contextvars.ContextVar[Optional["RequestTrace"]] = contextvars.ContextVar(
    "irpe_trace", default=None)
_NULL: ContextManager[None] = contextlib.nullcontext()


def _exporter_names() -> List[str]:
    """``OTEL_TRACES_EXPORTER`` as a list (``none`` dropped), or [] where unset."""
    names = [n.strip().lower() for n in os.environ.get(EXPORTERS, "").split(",")]
    return [n for n in names if n and n != "none"]


def tracing_wanted(settings: ServeSettings) -> bool:
    """Whether ``settings`` (and, with ``tracing: auto``, the ``OTEL_*`` variables) ask for
    traces: ``off`` never; ``on`` or an ``otlp_endpoint`` always; ``auto`` when
    ``OTEL_TRACES_EXPORTER`` names an exporter and ``OTEL_SDK_DISABLED`` is not true."""
    if settings.tracing == "off":
        return False
    if settings.tracing == "on" or settings.otlp_endpoint is not None:
        return True
    if os.environ.get(DISABLED, "").strip().lower() == "true":
        return False
    return bool(_exporter_names())


def setup_tracing(settings: ServeSettings) -> Optional["Tracing"]:
    """The app's :class:`Tracing` when traces are wanted, else None (nothing imported). One
    line (InvalidInput, exit 2) for a missing SDK, an unknown exporter or OTLP over gRPC."""
    if not tracing_wanted(settings):
        return None
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as exc:
        raise InvalidInput(f"tracing needs the OpenTelemetry SDK ({exc}): {INSTALL}") from None
    provider = TracerProvider(resource=_resource(), sampler=_sampler(settings),
                              shutdown_on_exit=False)  # the app's lifespan shuts it down
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    for exporter in _exporters(settings):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider)


def _resource() -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    return resource


def _sampler(settings: ServeSettings) -> Any:
    """Parent-based ratio of ``trace_sample_ratio``; None (the SDK reads OTEL_TRACES_SAMPLER
    and OTEL_TRACES_SAMPLER_ARG, default parent-based always-on) where it is not set."""
    if settings.trace_sample_ratio is None:
        return None
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    return ParentBased(TraceIdRatioBased(settings.trace_sample_ratio))


def _exporters(settings: ServeSettings) -> List[SpanExporter]:
    """OTLP/HTTP to ``otlp_endpoint``; else what OTEL_TRACES_EXPORTER names (otlp: the
    endpoint of OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT, default
    http://localhost:4318/v1/traces; console: stdout)."""
    names = ["otlp"] if settings.otlp_endpoint is not None else (_exporter_names() or ["otlp"])
    unknown = sorted(set(names) - {"otlp", "console"})
    if unknown:
        raise InvalidInput(f"{EXPORTERS}={','.join(names)}: irpe serve exports traces with "
                           f"otlp (OTLP/HTTP) or console, not {', '.join(unknown)}")
    exporters: List[SpanExporter] = []
    if "otlp" in names:
        exporters.append(_otlp(settings.otlp_endpoint))
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        exporters.append(ConsoleSpanExporter())
    return exporters


def _otlp(endpoint: Optional[str]) -> SpanExporter:
    """The OTLP/HTTP exporter (``endpoint``, else the SDK's variables); another protocol
    asked for by the variables is refused (one line)."""
    name, protocol = TRACES_PROTOCOL, os.environ.get(TRACES_PROTOCOL, "").strip().lower()
    if not protocol:
        name, protocol = PROTOCOL, os.environ.get(PROTOCOL, "").strip().lower()
    if protocol and protocol != "http/protobuf":
        raise InvalidInput(f"{name}={protocol}: irpe serve exports OTLP over HTTP "
                           "(http/protobuf, port 4318), not gRPC or JSON")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise InvalidInput(f"OTLP/HTTP export needs its exporter ({exc}): {INSTALL}") from None
    return OTLPSpanExporter(endpoint=endpoint)


class Tracing:
    """One app's tracer: its provider (resource, sampler, batch exporters) and the propagator
    of the ``OTEL_PROPAGATORS`` (default W3C trace context and baggage)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import propagate
        self.provider, self.tracer = provider, provider.get_tracer("irpe.serve")
        self.extract = propagate.extract

    def begin(self, scope: MutableMapping[str, Any]) -> Optional["RequestTrace"]:
        """The request's root span (a child of its ``traceparent``), made the current trace
        of the request's context; None when the sampler drops it."""
        from opentelemetry.trace import SpanKind
        if scope["path"] in UNTRACED or scope["path"].startswith("/v2/health/"):
            return None  # probes and scrapes: a span a second per prober says nothing
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        parent = self.extract(headers)
        root = self.tracer.start_span(scope["method"], context=parent, kind=SpanKind.SERVER,
                                      attributes={"http.request.method": scope["method"],
                                                  "url.path": scope["path"]})
        if not root.is_recording():
            return None
        trace = RequestTrace(self.tracer, root)
        trace.token = _current.set(trace)
        return trace

    def shutdown(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Export what is queued and stop the exporter threads (the app's lifespan, at stop),
        waiting at most ``timeout_s``: a collector that is down (the exporter retries for
        10 s) must not hold the server's stop past its SIGTERM budget."""
        done = threading.Thread(target=self.provider.shutdown, daemon=True,
                                name="irpe-trace-stop")
        done.start()
        done.join(timeout_s)
        if done.is_alive():
            log.warning("spans not exported at stop", extra={"timeout_s": timeout_s})


class RequestTrace:
    """The traced request: its root span and the stamps its children are made from."""

    __slots__ = ("tracer", "root", "context", "token", "model", "enqueued_ns", "queued",
                 "result_ns", "sent_ns", "bytes_in", "bytes_out")

    def __init__(self, tracer: Tracer, root: Span) -> None:
        from opentelemetry.trace import set_span_in_context
        self.tracer, self.root = tracer, root
        self.context: Context = set_span_in_context(root)
        self.token: Optional[contextvars.Token] = None
        self.model: Optional[str] = None
        self.enqueued_ns = self.result_ns = self.sent_ns = 0
        self.queued = False  # its queue_wait span is made (at its first batch)
        self.bytes_in = self.bytes_out = 0

    def child(self, name: str, start_ns: int, end_ns: int,
              attributes: Optional[Dict[str, Any]] = None, links: Sequence[Any] = (),
              error: Optional[str] = None) -> Span:
        """A finished child span of the root from ``start_ns`` to ``end_ns``."""
        child = self.tracer.start_span(name, context=self.context, start_time=start_ns,
                                       attributes=attributes, links=links)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode
            child.set_status(Status(StatusCode.ERROR, error))
        child.end(end_time=end_ns)
        return child

    def body_sent(self, end_ns: int) -> None:
        """The last body bytes go to the server at ``end_ns``: ``encode_response`` ends (when
        the request got its outputs), and so will the root span (the client may have the
        answer before the request log line is written)."""
        self.sent_ns = end_ns
        if self.result_ns:
            self.child("encode_response", self.result_ns, end_ns)

    def finish(self, method: str, route: str, status: int) -> None:
        """The root span's name, route, model, status and bytes; ended; context restored."""
        from opentelemetry.trace import Status, StatusCode
        root = self.root
        root.update_name(f"{method} {route}")
        root.set_attributes({"http.route": route, "http.response.status_code": status,
                             "http.request.body.size": self.bytes_in,
                             "http.response.body.size": self.bytes_out})
        if self.model is not None:
            root.set_attribute("irpe.model", self.model)
        if status >= 500:
            root.set_status(Status(StatusCode.ERROR))
        root.end(end_time=self.sent_ns or None)
        if self.token is not None:
            _current.reset(self.token)

    def ids(self) -> Dict[str, str]:
        """trace_id and span_id (the root's) as the log lines carry them: W3C hex."""
        ctx = self.root.get_span_context()
        return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


def current() -> Optional[RequestTrace]:
    """The traced request of this context, or None (tracing off, or not sampled)."""
    return _current.get()


def log_ids() -> Optional[Dict[str, str]]:
    """trace_id / span_id for a log line written while a traced request is handled."""
    trace = _current.get()
    return None if trace is None else trace.ids()


def span(name: str) -> ContextManager[None]:
    """A child span of the current request around the ``with`` block; nothing (a shared
    null context) when the request is not traced."""
    trace = _current.get()
    return _NULL if trace is None else _timed(trace, name)


@contextlib.contextmanager
def _timed(trace: RequestTrace, name: str) -> Iterator[None]:
    start, error = time.time_ns(), None
    try:
        yield
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        trace.child(name, start, time.time_ns(), error=error)


def record_batch(traces: Sequence[RequestTrace], start_ns: int, end_ns: int,
                 attributes: Dict[str, Any], error: Optional[str] = None) -> None:
    """One batch's spans: the ``batch`` span (a trace of its own, linked to each request's
    root), and for each traced request in it ``queue_wait`` (its first batch only) and an
    ``inference`` span linked to the batch span. Called by the model's batch worker, which a
    failure here must not stop: it is logged, the batch's answers are already given."""
    try:
        _record_batch(traces, start_ns, end_ns, attributes, error)
    except Exception as exc:  # noqa: BLE001 (telemetry never takes serving down)
        log.warning("trace spans of a batch lost", extra={"error": repr(exc)})


def _record_batch(traces: Sequence[RequestTrace], start_ns: int, end_ns: int,
                  attributes: Dict[str, Any], error: Optional[str]) -> None:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link
    unique = list(dict.fromkeys(traces))  # a request with several images in this batch
    first = unique[0]
    batch = first.tracer.start_span("batch", context=Context(), start_time=start_ns,
                                    attributes={**attributes, "irpe.traced_requests":
                                                len(unique)},
                                    links=[Link(t.root.get_span_context()) for t in unique])
    if error is not None:
        from opentelemetry.trace import Status, StatusCode
        batch.set_status(Status(StatusCode.ERROR, error))
    batch.end(end_time=end_ns)
    to_batch = [Link(batch.get_span_context())]
    for trace in unique:
        if not trace.queued:
            trace.queued = True
            trace.child("queue_wait", trace.enqueued_ns, start_ns)
        trace.child("inference", start_ns, end_ns, attributes, to_batch, error)
