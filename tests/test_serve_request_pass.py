"""A request's one pass (serve.model + serve.batching): the count rules in one place, the queue
room checked once and held while the request's images decode, released when decoding fails."""
from __future__ import annotations

import asyncio

import pytest

from serve.batching import Batcher
from serve.errors import ServeError
from serve.metrics import Metrics
from serve.model import check_count


def _batcher(queue: int) -> Batcher:
    return Batcher("m", [lambda items: [x * 10 for x in items]], lambda item: "k",
                   max_batch_size=4, max_delay_s=0.0, max_queue_size=queue, metrics=Metrics())


@pytest.mark.parametrize("count, error", [
    (0, "no image in the request"),
    (5, "5 images in one request; the limit is 4"),
    (4, "4 images in one request; model m queues at most 3")])
def test_count_rules_are_one_function(count, error):
    with pytest.raises(ServeError, match=error) as caught:
        check_count(count, max_images=4, max_queue_size=3, model="m")
    assert caught.value.status == 400
    check_count(3, max_images=4, max_queue_size=3, model="m")  # fits: no error


def test_room_is_held_while_a_request_decodes_then_released():
    async def run():
        batcher, decoding, release = _batcher(queue=2), asyncio.Event(), asyncio.Event()
        batcher.start()

        async def slow_decode():
            decoding.set()
            await release.wait()
            return [1, 2]

        first = asyncio.create_task(batcher.submit(2, slow_decode, 5.0))
        await decoding.wait()  # the first request's two images are being decoded
        with pytest.raises(ServeError) as full:
            await batcher.submit(1, _never, 5.0)
        with pytest.raises(ServeError, match="is full"):  # /v2's shed, before its body parses
            batcher.refuse_if_full(1)
        release.set()
        done = await first
        later = await batcher.submit(2, lambda: _ready([3, 4]), 5.0)  # room given back
        await batcher.close()
        return full.value, done, later
    full, done, later = asyncio.run(run())
    assert full.status == 503 and full.headers["Retry-After"] == "1"
    assert "queue of model m is full (2 of 2 images waiting)" in full.message
    assert done == ([1, 2], [10, 20]) and later == ([3, 4], [30, 40])


def test_a_failed_decode_gives_the_room_back():
    async def run():
        batcher = _batcher(queue=2)
        batcher.start()
        with pytest.raises(ValueError, match="bad image"):
            await batcher.submit(2, _bad, 5.0)
        out = await batcher.submit(2, lambda: _ready([5, 6]), 5.0)
        await batcher.close()
        return out
    assert asyncio.run(run()) == ([5, 6], [50, 60])


async def _ready(items):
    return items


async def _never():
    raise AssertionError("a refused request must not be decoded")


async def _bad():
    raise ValueError("bad image")
