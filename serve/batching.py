"""Dynamic batching: one worker per model drains a bounded queue into batches.

Requests add one item per image. The worker takes the oldest item, waits until
``max_batch_size`` items with the same key (same tensor shape; detection uses one key and pads)
are queued or ``max_queue_delay`` after the oldest item's arrival has passed, then runs the batch
in an inference thread, never on the event loop. A model with N instances has N workers, each
with its own thread and replica, taking batches from the one queue. A request's room is checked
once, when it arrives, and held for it while its inputs are made (images decoded): a full queue
answers 503 with Retry-After before any decoding. A request not answered within its timeout gets
504 and its items are skipped.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Deque, Dict, Hashable, List, Optional, Sequence, Tuple

from .errors import ServeError, unavailable
from .metrics import Metrics
from .tracing import RequestTrace, current, record_batch

__all__ = ["Batcher"]

RunBatch = Callable[[List[Any]], List[Any]]
KeyOf = Callable[[Any], Hashable]  # payload -> batch key (items of one batch share it)

log = logging.getLogger("irpe.serve")


@dataclass
class _Item:
    payload: Any
    key: Hashable
    future: asyncio.Future
    enqueued: float
    trace: Optional[RequestTrace] = None  # the request's, when it is traced


class Batcher:
    """Queue + worker tasks of one model; each ``runs[i](payloads) -> results`` runs in its own
    thread (one worker, thread and callable per model instance); ``key_of(payload)`` says which
    payloads may share a batch."""

    def __init__(self, name: str, runs: Sequence[RunBatch], key_of: KeyOf, max_batch_size: int,
                 max_delay_s: float, max_queue_size: int, metrics: Metrics) -> None:
        self.name, self.runs, self.key_of = name, list(runs), key_of
        self.max_batch_size, self.max_delay_s = max_batch_size, max_delay_s
        self.max_queue_size, self.metrics = max_queue_size, metrics
        self.executors = [ThreadPoolExecutor(1, thread_name_prefix=f"infer-{name}-{i}")
                          for i in range(len(runs))]
        self._items: Deque[_Item] = deque()
        self._held = 0  # room held for admitted requests whose inputs are being made
        self._wake = asyncio.Event()
        self._closing = False
        self._tasks: List[asyncio.Task] = []
        self.span_attributes: Dict[str, Any] = {}  # of its batch spans (serve.model)

    def start(self) -> None:
        """Start one worker task per instance (call from the event loop)."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._worker(i), name=f"{self.name}-{i}")
                       for i in range(len(self.runs))]

    async def in_thread(self, fn: Callable, *args, instance: int = 0) -> Any:
        """Run ``fn(*args)`` in an instance's inference thread (loading, warmup)."""
        return await asyncio.get_running_loop().run_in_executor(self.executors[instance], fn,
                                                                 *args)

    def refuse_if_full(self, count: int) -> None:
        """503 (Retry-After) when ``count`` more images do not fit now (queued + held)."""
        waiting = len(self._items) + self._held
        if waiting + count > self.max_queue_size:
            raise unavailable(f"queue of model {self.name} is full ({waiting} of "
                              f"{self.max_queue_size} images waiting); retry later")

    async def submit(self, count: int, make: Callable[[], Awaitable[Sequence[Any]]],
                     timeout_s: float) -> Tuple[List[Any], List[Any]]:
        """Hold room for ``count`` items (the request's one room check: 503 when the queue is
        full), await ``make()`` (decoding) for the payloads, queue them and wait for every
        result (504 past ``timeout_s``): (payloads, results) in order."""
        self.refuse_if_full(count)
        self._held += count
        try:
            payloads = list(await make())
        finally:
            self._held -= count
        if self._closing:  # began shutting down while the inputs were made
            raise unavailable(f"model {self.name} is shutting down")
        loop, trace = asyncio.get_running_loop(), current()
        items = [_Item(p, self.key_of(p), loop.create_future(), loop.time(), trace)
                 for p in payloads]
        if trace is not None:
            trace.model, trace.enqueued_ns = self.name, time.time_ns()
        self._items.extend(items)
        self._changed()
        try:
            results = await asyncio.wait_for(asyncio.gather(*(i.future for i in items)),
                                             timeout_s)
        except asyncio.TimeoutError:
            raise ServeError(504, f"model {self.name} did not answer within {timeout_s:g} s") \
                from None
        finally:
            for item in items:
                if not item.future.done():
                    item.future.cancel()  # the worker skips cancelled items
        if trace is not None:
            trace.result_ns = time.time_ns()
        return payloads, list(results)

    async def close(self) -> None:
        """Refuse new work, finish every queued item, stop the worker and its thread."""
        self._closing = True
        self._wake.set()
        await asyncio.gather(*self._tasks)
        for executor in self.executors:
            executor.shutdown(wait=True)

    def _changed(self) -> None:
        self.metrics.queue_depth.labels(self.name).set(len(self._items))
        self._wake.set()

    async def _worker(self, instance: int) -> None:
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            await self._run(batch, instance)

    async def _next_batch(self) -> Optional[List[_Item]]:
        """The next non-empty batch, or None once closing with nothing queued."""
        while True:
            while self._items and self._items[0].future.done():
                self._items.popleft()  # timed out or cancelled while waiting
                self.metrics.queue_depth.labels(self.name).set(len(self._items))
            if not self._items:
                if self._closing:
                    return None
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._fill(self._items[0].enqueued + self.max_delay_s, self._items[0].key)
            batch = self._take()
            if batch:  # empty when every item timed out while the batch filled: run nothing
                return batch

    async def _fill(self, deadline: float, key: Hashable) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing and self._count(key) < self.max_batch_size:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _count(self, key: Hashable) -> int:
        return sum(1 for i in self._items if i.key == key and not i.future.done())

    def _take(self) -> List[_Item]:
        key = self._items[0].key
        batch: List[_Item] = []
        rest: Deque[_Item] = deque()
        for item in self._items:
            if item.future.done():
                continue
            if item.key == key and len(batch) < self.max_batch_size:
                batch.append(item)
            else:
                rest.append(item)
        self._items = rest
        self._changed()
        return batch

    async def _run(self, batch: List[_Item], instance: int) -> None:
        loop = asyncio.get_running_loop()
        start, start_ns = loop.time(), time.time_ns()
        traces = [i.trace for i in batch if i.trace is not None]
        for item in batch:
            self.metrics.queue_time.labels(self.name).observe(start - item.enqueued)
        try:
            results = await loop.run_in_executor(self.executors[instance], self.runs[instance],
                                                 [i.payload for i in batch])
        except Exception as exc:  # any backend failure fails this batch's requests only
            log.error("inference failed", extra={"model": self.name, "error": repr(exc)})
            self._finish(batch, start, "failure")
            error = ServeError(500, f"inference failed: {type(exc).__name__}: {exc}")
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
            self._traced(traces, start_ns, instance, len(batch), error.message)
            return
        end_ns = time.time_ns()
        self._finish(batch, start, "success")
        for item, result in zip(batch, results, strict=True):
            if not item.future.done():
                item.future.set_result(result)
        self._traced(traces, start_ns, instance, len(batch), end_ns=end_ns)

    def _traced(self, traces: List[RequestTrace], start_ns: int, instance: int, size: int,
                error: Optional[str] = None, end_ns: int = 0) -> None:
        """The batch's spans (serve.tracing.record_batch) when a traced request was in it."""
        if traces:
            record_batch(traces, start_ns, end_ns or time.time_ns(), {
                **self.span_attributes, "irpe.batch_size": size, "irpe.instance": instance},
                error)

    def _finish(self, batch: List[_Item], start: float, outcome: str) -> None:
        self.metrics.compute_time.labels(self.name).observe(
            asyncio.get_running_loop().time() - start)
        self.metrics.batch_size.labels(self.name).observe(len(batch))
        self.metrics.batches.labels(self.name, outcome).inc()
