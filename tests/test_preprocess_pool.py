"""Serving preprocessing: JPEG draft decoding (bounded difference, full-decode geometry, original
size kept), uint8 inputs normalised like Preprocess bit for bit, the decode pool."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from irpe.data.transforms import (
    ImageError,
    Preprocess,
    load_image,
    load_image_for,
    normalize,
    resize_shorter,
    to_tensor,
)
from serve import preprocess_pool
from serve.preprocess_pool import decode_u8, map_images

CLS = Preprocess()
DET = Preprocess(task="detection", min_size=200, max_size=333)
# draft vs full decode, in 0..255 levels of the resized image (measured: mean <= 1.2, max 12)
MEAN_BOUND, MAX_BOUND = 2.0, 16.0


def _photo(width: int, height: int, exif_orientation: int = 1, fmt: str = "JPEG") -> bytes:
    """A smooth gradient image with mild noise (JPEG-like content), encoded."""
    rng = np.random.default_rng(width * 7 + height)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(np.sin(x / 37) + np.cos(y / 23)) * 60 + 128, x * 255 / width,
                    y * 255 / height], -1)
    image = Image.fromarray(np.clip(rgb + rng.normal(0, 12, rgb.shape), 0, 255).astype(np.uint8))
    buf, kw = io.BytesIO(), {}
    if exif_orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kw["exif"] = exif.tobytes()
    image.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}), **kw)
    return buf.getvalue()


def _levels(a: torch.Tensor, b: torch.Tensor, pre: Preprocess) -> torch.Tensor:
    """|a - b| of two normalised tensors in 0..255 pixel levels."""
    return (a - b).abs() * torch.tensor(pre.std).view(3, 1, 1) * 255


@pytest.mark.parametrize("pre", [CLS, DET], ids=["classification", "detection"])
@pytest.mark.parametrize("size,orientation", [((2000, 1333), 1), ((1333, 2000), 1),
                                              ((3001, 2001), 1), ((2000, 1200), 6)])
def test_draft_decode_is_reduced_with_full_geometry_and_bounded_difference(pre, size,
                                                                           orientation):
    blob = _photo(*size, exif_orientation=orientation)
    full_image = load_image(blob)
    image, full = load_image_for(blob, pre)
    assert full == full_image.size  # upright size of the full decode (EXIF 6 swaps w and h)
    assert image.width <= -(-full[0] // 2) and image.height <= -(-full[1] // 2)  # reduced
    target = resize_shorter(full, int(pre.size / pre.crop_pct) if pre is CLS else pre.min_size,
                            0 if pre is CLS else pre.max_size)
    assert image.width >= 2 * target[0] and image.height >= 2 * target[1]  # DRAFT_MARGIN
    reference, reduced = pre(full_image), pre(image, full)
    assert reference.shape == reduced.shape
    diff = _levels(reference, reduced, pre)
    assert diff.mean() <= MEAN_BOUND and diff.max() <= MAX_BOUND


def test_no_draft_for_small_jpegs_or_other_formats():
    small = _photo(451, 300)
    image, full = load_image_for(small, CLS)
    assert full == (451, 300) and image.size == (451, 300)
    assert torch.equal(CLS(image, full), CLS(load_image(small)))
    png = _photo(2000, 1333, fmt="PNG")
    image, full = load_image_for(png, CLS)
    assert image.size == full == (2000, 1333)
    assert CLS.draft_request(451, 300) is None and CLS.draft_request(2000, 1333) is not None


@pytest.mark.parametrize("pre", [CLS, DET], ids=["classification", "detection"])
def test_uint8_then_normalize_equals_preprocess_bit_for_bit(pre):
    blob = _photo(451, 300)
    pixels, (h, w) = decode_u8(blob, pre)
    assert pixels.dtype == np.uint8 and (h, w) == (300, 451)
    expected = pre(load_image(blob)).numpy()
    assert np.array_equal(normalize(torch.from_numpy(pixels[None]), pre.mean, pre.std)[0].numpy(),
                          expected)


def test_normalize_is_the_formula_on_any_layout():
    pixels = np.random.default_rng(3).integers(0, 256, (2, 3, 5, 7), dtype=np.uint8)
    mean, std = np.array(CLS.mean), np.array(CLS.std)
    want = (pixels / 255.0 - mean[:, None, None]) / std[:, None, None]  # float64
    got = normalize(torch.from_numpy(pixels), CLS.mean, CLS.std)
    assert got.dtype == torch.float32 and np.abs(got.numpy() - want).max() < 1e-6
    image = Image.fromarray(pixels[0].transpose(1, 2, 0))  # training's to_tensor: the same
    assert torch.equal(to_tensor(image, CLS.mean, CLS.std), got[0])


def test_normalize_keeps_detection_padding_zero():
    batch = np.full((2, 3, 6, 8), 200, np.uint8)
    out = normalize(torch.from_numpy(batch), DET.mean, DET.std, np.array([[6, 8], [4, 5]]))
    assert (out[1, :, 4:, :] == 0).all() and (out[1, :, :, 5:] == 0).all()
    assert (out[1, :, :4, :5] != 0).all() and (out[0] != 0).all()


def test_map_images_keeps_order_and_names_the_bad_image(files):
    from serve.config import ModelConfig
    from serve.metrics import Metrics
    from serve.model import ServedModel
    blobs = [_photo(120 + 10 * i, 90) for i in range(5)]
    assert map_images(lambda i, b: (i, len(b)), blobs) == [(i, len(b)) for i, b in
                                                            enumerate(blobs)]
    model = ServedModel(ModelConfig(name="d", path=files["det"]), Metrics())
    prepared = model.prepare(blobs)
    assert [p[1] for p in prepared] == [(90, 120 + 10 * i) for i in range(5)]  # original (h, w)
    with pytest.raises(ImageError, match=r"^image 2: cannot decode image"):
        model.prepare(blobs[:2] + [b"not an image"] + blobs[3:])
    with pytest.raises(ImageError, match="empty image data"):
        model.prepare([b""])


def test_request_decode_is_fifo_in_the_shared_pool(files):
    """What a request awaits (ServedModel.decode): the prepare() answer, each image a task of
    the one shared decode pool (its FIFO queue is what the tail-latency fix relies on)."""
    import asyncio
    import threading

    from serve.config import ModelConfig
    from serve.metrics import Metrics
    from serve.model import ServedModel
    model = ServedModel(ModelConfig(name="d", path=files["det"]), Metrics())
    blobs = [_photo(120 + 10 * i, 90) for i in range(5)]
    started, threads = [], set()

    def record(i: int, blob: bytes):
        started.append(i)
        threads.add(threading.current_thread().name)
        return i

    async def run():
        got = await model.decode(blobs)
        order = await asyncio.gather(*(preprocess_pool.map_images_fifo(record, [b])
                                       for b in blobs))
        with pytest.raises(ImageError, match=r"^image 1: cannot decode image"):
            await model.decode([blobs[0], b"not an image"])
        return got, order
    got, order = asyncio.run(run())
    assert [(g[0].tobytes(), g[1]) for g in got] == [(p[0].tobytes(), p[1])
                                                    for p in model.prepare(blobs)]
    assert order == [[0]] * 5 and sorted(started) == [0] * 5
    assert asyncio.run(preprocess_pool.map_images_fifo(record, blobs)) == list(range(5))
    assert threads and all(t.startswith("decode") for t in threads)  # the shared pool's


def _meet(parties: int, timeout_s: float) -> bool:
    """Whether ``parties`` images decode at once in the shared pool (all meet at a barrier)."""
    barrier = threading.Barrier(parties, timeout=timeout_s)

    def wait(index: int, blob: bytes) -> None:
        barrier.wait()

    try:
        map_images(wait, [b""] * parties)
    except threading.BrokenBarrierError:
        return False
    return True


def test_decode_threads_setting_sizes_the_pool(monkeypatch, files):
    """IRPE_SERVE_DECODE_THREADS=3 (ServeSettings.decode_threads, applied by create_app): 3
    images decode at once, a 4th waits for a free thread; 0 gives back one per CPU."""
    from serve.app import create_app
    from serve.config import ServeSettings
    monkeypatch.setenv("IRPE_SERVE_DECODE_THREADS", "3")
    try:
        create_app(ServeSettings(models=[{"name": "m", "path": files["cls"]}]))
        assert _meet(3, 10.0) and not _meet(4, 0.5)
    finally:
        assert preprocess_pool.set_decode_threads(0) == preprocess_pool.host_workers()
    with pytest.raises(ValueError, match="decode threads must be >= 0"):
        preprocess_pool.set_decode_threads(-1)
