"""Prometheus metrics of one server instance (its own registry, so apps never collide)."""
from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from irpe.idcache import BUCKET_IDS

from .memory import Footprint, peak_rss_bytes

__all__ = ["Metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)


class Metrics:
    """HTTP counters (client hang-ups apart) and latency, in-flight gauge, queue/compute time,
    batch sizes, the bucket-id cache size, each model's memory and the process's (resident,
    peak; prometheus_client's process_* metrics)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("irpe_http_requests_total", "HTTP requests by route, method and "
                                "status", ["route", "method", "status"], registry=r)
        self.disconnected = Counter("irpe_http_client_disconnected_total", "requests whose "
                                    "client hung up before its body was read (logged as 499)",
                                    ["route", "method"], registry=r)
        self.latency = Histogram("irpe_http_request_duration_seconds", "HTTP request latency",
                                 ["route"], buckets=_SECONDS, registry=r)
        self.in_flight = Gauge("irpe_http_requests_in_flight", "HTTP requests being served",
                               registry=r)
        self.queue_time = Histogram("irpe_queue_seconds", "time an image waited for its batch",
                                    ["model"], buckets=_SECONDS, registry=r)
        self.compute_time = Histogram("irpe_compute_seconds", "backend time of one batch",
                                      ["model"], buckets=_SECONDS, registry=r)
        self.batch_size = Histogram("irpe_batch_size", "images per backend call", ["model"],
                                    buckets=_SIZES, registry=r)
        self.queue_depth = Gauge("irpe_queue_depth", "images waiting for a batch", ["model"],
                                 registry=r)
        self.batches = Counter("irpe_batches_total", "backend calls by model and outcome",
                               ["model", "outcome"], registry=r)
        self.bucket_cache = Gauge("irpe_bucket_cache_bytes", "bucket-id tensors cached by the "
                                  "torch backend (process-wide LRU)", registry=r)
        self.bucket_cache.set_function(lambda: BUCKET_IDS.nbytes)
        self.bucket_cache_limit = Gauge("irpe_bucket_cache_limit_bytes", "limit of that cache "
                                        "(IRPE_BUCKET_CACHE_MIB)", registry=r)
        self.bucket_cache_limit.set_function(lambda: BUCKET_IDS.max_bytes)
        self.host_memory = Gauge("irpe_model_host_memory_bytes", "resident memory a model's "
                                 "load and warm-up added to the process (all its instances)",
                                 ["model"], registry=r)
        self.device_memory = Gauge("irpe_model_device_memory_bytes", "CUDA memory a model's "
                                   "load and warm-up added (all its instances)", ["model"],
                                   registry=r)
        self.peak_rss = Gauge("irpe_process_peak_resident_memory_bytes", "the process's peak "
                              "resident memory (getrusage)", registry=r)
        self.peak_rss.set_function(peak_rss_bytes)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total

    def model_memory(self, model: str, footprint: Footprint) -> None:
        """Publish what a loaded model holds (a figure left unknown stays absent)."""
        if footprint.host_bytes is not None:
            self.host_memory.labels(model).set(footprint.host_bytes)
        if footprint.device_bytes is not None:
            self.device_memory.labels(model).set(footprint.device_bytes)

    def render(self) -> bytes:
        """Text exposition format of every metric."""
        return generate_latest(self.registry)
