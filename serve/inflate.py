"""Undo a request body's Content-Encoding off the event loop, chunk by chunk, within the limit.

Inflating on the event loop stalled every other request for the length of the inflation (issue
42: 4 clients sending 32 KB of gzip that inflates to 32 MiB raised ``/v2/health/live`` p50 from
0.9 ms to ~290 ms). Here the body is inflated as it arrives, in a small process-wide thread pool
(zlib releases the GIL while it inflates), never holding more than ``limit`` inflated bytes: a
413 as soon as the output passes it (no decompression bomb), a 400 for a corrupt or truncated
stream.

gzip's own rules (RFC 1952, as ``gzip -d`` and Python's ``gzip`` read them): a body of several
gzip members is their concatenation; zero bytes after a member are padding; anything else after
a member is not gzip, and a 400 says so (it used to be ignored, and a second member cut off).
A ``deflate`` body is one zlib stream; data after its end is refused the same way.
"""
from __future__ import annotations

import asyncio
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, List, Sequence

from .errors import ServeError

__all__ = ["CODINGS", "Inflater", "inflate"]

CODINGS = {"gzip": 31, "deflate": 15}  # Content-Encoding -> zlib wbits (deflate = zlib stream)
FEED_BYTES = 256 << 10  # compressed bytes handed to the pool at a time
_GZIP_MAGIC = b"\x1f\x8b"
_POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                           thread_name_prefix="irpe-inflate")


class _Stage:
    """One coding being undone: a zlib inflater, and for gzip the state between members."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self.inflater = zlib.decompressobj(wbits=CODINGS[coding])
        self.between = False  # gzip: a member ended; padding or a new member may follow
        self.carry = b""      # gzip: the first byte of what may be the next member's magic
        self.size = 0

    def feed(self, data: bytes, limit: int) -> List[bytes]:
        """Inflate ``data``; the output pieces (400 / 413 as the module says)."""
        out: List[bytes] = []
        data = self.carry + data
        self.carry = b""
        while data:
            if self.inflater.eof and not self.between:
                raise self._error("trailing data after the end of the deflate stream")
            if self.between:
                data = data.lstrip(b"\0")
                if not data:
                    break
                if not _GZIP_MAGIC.startswith(data[:2]):
                    raise self._error("trailing data after the end of the gzip stream")
                if len(data) < 2:
                    self.carry = data
                    break
                self.inflater, self.between = zlib.decompressobj(wbits=CODINGS["gzip"]), False
            try:
                piece = self.inflater.decompress(data, limit - self.size + 1)
            except zlib.error as exc:
                raise self._error(str(exc)) from None
            self.size += len(piece)
            if self.size > limit:
                raise ServeError(413, f"decompressed body is over the limit of {limit} bytes")
            if piece:
                out.append(piece)
            if self.inflater.eof:
                data = self.inflater.unused_data
                self.between = self.coding == "gzip"
            else:  # all input taken (the output stopped short of the limit)
                data = self.inflater.unconsumed_tail
        return out

    def finish(self) -> None:
        """400 unless the stream ended where the body did."""
        if self.carry:
            raise self._error("trailing data after the end of the gzip stream")
        if not self.inflater.eof:
            raise self._error("the stream is truncated")

    def _error(self, why: str) -> ServeError:
        return ServeError(400, f"cannot decompress the {self.coding} body: {why}")


class Inflater:
    """Undo ``codings`` (in the order applied: the last one is undone first) on a body fed in
    pieces, holding at most ``limit`` bytes after each stage. Not thread-safe: one request's
    pieces are fed one after the other."""

    def __init__(self, codings: Sequence[str], limit: int) -> None:
        self.stages = [_Stage(c) for c in reversed(codings)]
        self.limit = limit
        self.pieces: List[bytes] = []

    def feed(self, data: bytes) -> None:
        """Inflate the next piece of the body."""
        pieces = [data]
        for stage in self.stages:
            pieces = [out for piece in pieces for out in stage.feed(piece, self.limit)]
        self.pieces.extend(pieces)

    def finish(self, data: bytes = b"") -> bytes:
        """Feed the last piece, check every stream ended, and return the inflated body."""
        self.feed(data)
        for stage in self.stages:
            stage.finish()
        body, self.pieces = b"".join(self.pieces), []
        return body


async def inflate(chunks: AsyncIterator[bytes], codings: Sequence[str], limit: int) -> bytes:
    """The body streamed by ``chunks`` with ``codings`` undone, inflated in the pool (in
    pieces of about FEED_BYTES compressed bytes) while the event loop serves other requests."""
    loop = asyncio.get_running_loop()
    inflater, pending = Inflater(codings, limit), bytearray()
    async for chunk in chunks:
        pending += chunk
        if len(pending) >= FEED_BYTES:
            await loop.run_in_executor(_POOL, inflater.feed, bytes(pending))
            pending.clear()
    return await loop.run_in_executor(_POOL, inflater.finish, bytes(pending))
