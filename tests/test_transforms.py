"""irpe.data.transforms: resize/crop geometry (torchvision, DETR), normalisation, decoding
(high bit depths scaled to 8 bit, EXIF orientation), and detection sizes its own check accepts."""
import io
import json
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from irpe.data import transforms as T
from irpe.data.shapes import SHAPE_CLASSES, render_classification
from irpe.data.transforms import (
    ImageError,
    ImageTooLargeError,
    Preprocess,
    center_crop_box,
    load_image,
    resize_shorter,
)
from tests.helpers import encode


def tv_resize(w, h, size):
    """torchvision Resize(int): shorter side -> size, longer int(size * long / short)."""
    short, long = (w, h) if w <= h else (h, w)
    if short == size:
        return w, h
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if w <= h else (new_long, new_short)


def detr_resize(w, h, size, max_size):
    """DETR's get_size_with_aspect_ratio, returned as (w, h)."""
    lo, hi = float(min(w, h)), float(max(w, h))
    if hi / lo * size > max_size:
        size = int(round(max_size * lo / hi))
    if (w <= h and w == size) or (h <= w and h == size):
        return w, h
    return (size, int(size * h / w)) if w < h else (int(size * w / h), size)


def coordinate_image(w, h):
    """R = x, G = y (mod 256): a pixel's value says where it came from."""
    ys, xs = np.mgrid[0:h, 0:w]
    return Image.fromarray(np.stack([xs % 256, ys % 256, np.zeros_like(xs)], -1).astype(np.uint8))


def unnormalise(x, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
    x = x * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
    return torch.round(x * 255).to(torch.int64)


def png_bytes(image, fmt="PNG"):
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def png_header_only(width, height):
    """A valid PNG signature + IHDR (8-bit RGB) + IEND, with no pixel data at all."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [1, 7, 64, 224, 256, 383])
def test_resize_shorter_matches_torchvision(size):
    for w in [1, 2, 3, 10, 63, 64, 100, 224, 255, 256, 257, 333, 640, 1001]:
        for h in [1, 5, 64, 99, 224, 256, 480, 777]:
            assert resize_shorter((w, h), size) == tv_resize(w, h, size), (w, h, size)


@pytest.mark.parametrize("min_size,max_size", [(800, 1333), (128, 200), (64, 64)])
def test_resize_shorter_matches_detr(min_size, max_size):
    for w in [2, 3, 17, 64, 100, 128, 591, 640, 800, 1333, 2000]:
        for h in [2, 5, 64, 127, 480, 800, 1080, 3000]:
            ours, detr = resize_shorter((w, h), min_size, max_size), \
                detr_resize(w, h, min_size, max_size)
            assert max(ours) <= max_size and min(ours) >= 1, (w, h)
            if min(detr) == 0:  # DETR fails there (0-pixel side); we keep one pixel
                assert min(ours) == 1, (w, h)
            elif max(detr) <= max_size:
                assert ours == detr, (w, h)
    # DETR itself may exceed max_size by rounding the shorter side up: we round down there
    assert detr_resize(2, 591, 800, 1333) == (5, 1477)
    assert resize_shorter((2, 591), 800, 1333) == (4, 1182)


def test_resize_shorter_never_zero():
    # DETR's rule gives 0 pixels here (PIL then raises); we keep one pixel
    assert detr_resize(4000, 1, 800, 1333)[1] == 0
    assert resize_shorter((4000, 1), 800, 1333) == (1333, 1)  # longer side capped too
    out = Preprocess(task="detection")(Image.new("RGB", (4000, 1)))
    assert out.shape == (3, 1, 1333)


@pytest.mark.parametrize("w,h,left,top", [
    (224, 301, 0, 38),   # (301-224)/2 = 38.5 rounds half to even -> 38, like torchvision
    (303, 224, 40, 0),   # 39.5 -> 40
    (224, 224, 0, 0), (250, 224, 13, 0)])
def test_center_crop_offsets(w, h, left, top):
    assert center_crop_box((w, h), 224) == (left, top, left + 224, top + 224)
    out = unnormalise(Preprocess(size=224, crop_pct=1.0)(coordinate_image(w, h)))
    assert out.shape == (3, 224, 224)
    assert out[0, 0, 0] == left and out[1, 0, 0] == top  # the crop starts at (left, top)
    assert out[0, 0, 223] == (left + 223) % 256 and out[1, 223, 0] == (top + 223) % 256


def test_classification_pipeline_equals_resize_then_crop():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (90, 130, 3), np.uint8))
    tf = Preprocess(size=48, crop_pct=0.9)           # resize shorter side to int(48/0.9) = 53
    scaled = tv_resize(130, 90, 53)
    assert scaled == (76, 53)
    left, top = int(round((76 - 48) / 2.0)), int(round((53 - 48) / 2.0))
    ref = image.resize(scaled, Image.BICUBIC).crop((left, top, left + 48, top + 48))
    assert torch.equal(unnormalise(tf(image)), torch.from_numpy(
        np.asarray(ref, np.int64).transpose(2, 0, 1)))


def test_detection_output_size():
    out = Preprocess(task="detection", min_size=100, max_size=150)(Image.new("RGB", (300, 120)))
    assert out.shape == (3, 60, 150)   # 300/120*100 = 250 > 150 -> shorter round(150*120/300)


def test_extreme_aspect_ratio_stays_bounded():
    # full resize would be 256 x 10.24M pixels; only the crop's source region is resized
    image = Image.new("RGB", (1, 40_000), (10, 200, 30))
    out = unnormalise(Preprocess(size=224)(image))
    assert out.shape == (3, 224, 224)
    assert torch.equal(out, torch.tensor([10, 200, 30])[:, None, None].expand(3, 224, 224))


def test_bounded_path_equals_full_resize_on_smooth_image(monkeypatch):
    ys, xs = np.mgrid[0:700, 0:100]
    image = Image.fromarray(np.stack([xs * 2, ys * 255 // 700, (xs + ys) % 256], -1)
                            .astype(np.uint8))
    full = Preprocess(size=64)(image)
    monkeypatch.setattr(T, "MAX_RESIZED_PIXELS", 0)
    assert torch.allclose(Preprocess(size=64)(image), full, atol=2 / 255 / 0.224)


def test_normalisation_values():
    out = Preprocess(size=8, crop_pct=1.0)(Image.new("RGB", (8, 8), (255, 0, 128)))
    expect = [(1.0 - 0.485) / 0.229, (0.0 - 0.456) / 0.224, (128 / 255 - 0.406) / 0.225]
    assert out.dtype == torch.float32
    for c in range(3):
        assert torch.allclose(out[c], torch.full((8, 8), expect[c]), atol=1e-6)
    custom = Preprocess(size=8, crop_pct=1.0, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert torch.allclose(custom(Image.new("RGB", (8, 8), (255, 0, 255)))[:, 0, 0],
                          torch.tensor([1.0, -1.0, 1.0]))


def test_load_image_modes_and_paths(tmp_path):
    gray = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8), "L")
    image = load_image(png_bytes(gray))
    assert image.mode == "RGB" and image.getpixel((3, 1)) == (11, 11, 11)
    rgba = Image.new("RGBA", (4, 4), (1, 2, 3, 4))
    path = tmp_path / "a.png"
    rgba.save(path)
    assert load_image(str(path)).getpixel((0, 0)) == (1, 2, 3)
    assert load_image(bytearray(png_bytes(rgba))).size == (4, 4)
    with pytest.raises(FileNotFoundError):
        load_image(str(tmp_path / "missing.png"))
    with pytest.raises(ImageError):
        load_image(str(tmp_path))  # a directory


def test_load_image_refuses_bad_bytes():
    noise = Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), np.uint8))
    png, jpeg = png_bytes(noise), png_bytes(noise, "JPEG")
    cases = {"empty": b"", "text": b"definitely not an image", "png": png[:len(png) // 2],
             "jpeg": jpeg[:len(jpeg) // 2], "png-header": png[:40]}
    for name, data in cases.items():
        with pytest.raises(ImageError) as err:
            load_image(data)
        assert not isinstance(err.value, ImageTooLargeError), name


def test_load_image_refuses_formats_outside_the_list():
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"
    assert Image.open(io.BytesIO(eps)).format == "EPS"  # PIL alone would take it
    with pytest.raises(ImageError, match="cannot decode"):
        load_image(eps)


def test_load_image_pixel_limit():
    data = png_bytes(Image.new("RGB", (10, 10)))
    assert load_image(data, max_pixels=100).size == (10, 10)
    with pytest.raises(ImageTooLargeError, match="10x10 pixels is over the limit of 99"):
        load_image(data, max_pixels=99)


@pytest.mark.parametrize("side", [8000, 20000])  # 20000: over PIL's own bomb limit too
def test_huge_header_refused_before_decoding(side):
    with pytest.raises(ImageTooLargeError, match="over the limit"):
        load_image(png_header_only(side, side))


def test_header_check_comes_before_decoding():
    data = png_header_only(300, 300)  # header only: decoding it fails
    with pytest.raises(ImageTooLargeError, match="300x300"):
        load_image(data, max_pixels=1000)
    with pytest.raises(ImageError, match="cannot decode"):
        load_image(data)


def test_preprocess_dict_round_trip():
    for pre in [Preprocess(), Preprocess("detection", min_size=128, max_size=200),
                Preprocess(size=64, crop_pct=1.0, mean=(0.5, 0.5, 0.5), std=(0.25, 0.5, 1.0))]:
        data = json.loads(json.dumps(pre.to_dict()))
        assert Preprocess.from_dict(data) == pre
        assert hash(Preprocess.from_dict(data)) == hash(pre)


@pytest.mark.parametrize("data,message", [
    ({"colour": 1}, "unknown preprocessing fields"),
    ({"task": "segmentation"}, "task must be one of"),
    ({"size": 0}, "size must be a positive integer"),
    ({"size": "224"}, "size must be a positive integer"),
    ({"size": True}, "size must be a positive integer"),
    ({"min_size": 12.5}, "min_size must be a positive integer"),
    ({"crop_pct": 0}, "crop_pct must be"),
    ({"crop_pct": 1.5}, "crop_pct must be"),
    ({"crop_pct": "0.9"}, "crop_pct must be"),
    ({"crop_pct": float("nan")}, "crop_pct must be"),
    ({"mean": [0.5, 0.5]}, "mean must be 3 numbers"),
    ({"mean": "abc"}, "mean must be 3 numbers"),
    ({"std": [0.2, 0.0, 0.2]}, "std must be positive"),
    ([("size", 3)], "must be a dict"),
])
def test_preprocess_bad_fields(data, message):
    with pytest.raises(ValueError, match=message):
        Preprocess.from_dict(data)


def gray_star(seed: int = 7, index: int = 6) -> np.ndarray:
    """8-bit grayscale star of the synthetic shapes set (class index 6 = star)."""
    image, label = render_classification(seed, index, 64, "val")
    assert SHAPE_CLASSES[label] == "star"
    return np.asarray(image.convert("L"))


def test_16bit_png_decodes_like_its_8bit_twin():
    g8 = gray_star()
    png16 = encode(Image.fromarray(g8.astype(np.uint16) * 257), "PNG")
    assert Image.open(io.BytesIO(png16)).mode == "I;16"
    got, twin = np.asarray(load_image(png16)), np.asarray(load_image(encode(
        Image.fromarray(g8), "PNG")))
    assert got.shape == twin.shape == (64, 64, 3)
    assert np.array_equal(got, twin)  # main: 255 everywhere (convert("RGB") clamps)
    assert got.min() < 128 < got.max()


@pytest.mark.parametrize("scale,fmt", [(257, "TIFF"), (1, "TIFF")])
def test_32bit_integer_tiff_scaled_by_its_range(scale, fmt):
    g8 = gray_star()
    blob = encode(Image.fromarray(g8.astype(np.int32) * scale), fmt)
    assert Image.open(io.BytesIO(blob)).mode == "I"
    assert np.array_equal(np.asarray(load_image(blob))[..., 0], g8)


def test_float_tiff_in_unit_range_and_bad_values():
    g8 = gray_star()
    blob = encode(Image.fromarray(g8.astype(np.float32) / 255), "TIFF")
    assert np.abs(np.asarray(load_image(blob))[..., 0].astype(int) - g8).max() <= 1
    weird = np.array([[np.nan, np.inf], [-5.0, 0.5]], np.float32)
    out = np.asarray(load_image(encode(Image.fromarray(weird, "F"), "TIFF")))[..., 0]
    assert out.tolist() == [[0, 0], [0, 128]]  # NaN/inf/negative -> 0, no crash
    black = np.asarray(load_image(encode(Image.fromarray(np.zeros((3, 3), np.uint16)), "PNG")))
    assert black.max() == 0


def test_16bit_star_classified_star_by_the_demo_classifier():
    from irpe.artifact.trained import load_trained
    from irpe.models import model_info
    from irpe.models.registry import bundled_weights
    torch.set_num_threads(1)
    model, spec = load_trained(bundled_weights(model_info("deit_shapes_irpe")))
    png16 = encode(Image.fromarray(gray_star().astype(np.uint16) * 257), "PNG")
    with torch.no_grad():
        probs = model(spec.transform()(load_image(png16))[None]).softmax(-1)[0]
    assert SHAPE_CLASSES[int(probs.argmax())] == "star" and probs.max() > 0.5


def oriented_jpeg(orientation: int) -> bytes:
    """Stored 200 wide x 128 tall, red block in the stored top-left corner, EXIF orientation."""
    image = Image.new("RGB", (200, 128), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 40, 40))
    exif = image.getexif()
    exif[0x0112] = orientation
    return encode(image, "JPEG", quality=95, exif=exif.tobytes())


@pytest.mark.parametrize("orientation,size,red_at", [
    (1, (200, 128), (10, 10)),     # upright: unchanged
    (6, (128, 200), (117, 10)),    # rotate 90 clockwise to display: top-left -> top-right
    (8, (128, 200), (10, 189)),    # rotate 90 counter-clockwise: top-left -> bottom-left
    (3, (200, 128), (189, 117))])  # rotate 180: top-left -> bottom-right
def test_exif_orientation_applied_at_decode(orientation, size, red_at):
    image = load_image(oriented_jpeg(orientation))
    assert image.size == size
    r, g, b = image.getpixel(red_at)
    assert r > 200 and b < 60, (orientation, image.getpixel(red_at))


def test_bad_exif_orientation_value_is_ignored():
    assert load_image(oriented_jpeg(99)).size == (200, 128)
    with pytest.raises(ImageError):
        load_image(oriented_jpeg(6)[:300])  # truncated JPEG: still a clear ImageError


DETR_CONFIGS = [(128, 256), (800, 1333), (64, 64), (480, 640), (1, 1)]


def test_detection_resize_fits_its_own_check_on_a_grid():
    sides = sorted({1, 2, 3, 7, 31, 100, 123, 127, 255, 256, 257, 480, 591, 799, 800, 1000,
                    1003, 1333, 1334, 2047, 4000})
    for min_size, max_size in DETR_CONFIGS:
        p = Preprocess(task="detection", min_size=min_size, max_size=max_size)
        for w in sides:
            for h in sides:
                rw, rh = resize_shorter((w, h), min_size, max_size)
                assert p.fits(rh, rw), (w, h, min_size, max_size, rw, rh)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 20000), st.integers(1, 1400),
       st.integers(0, 1400))
def test_detection_resize_fits_its_own_check_property(w, h, min_size, extra):
    p = Preprocess(task="detection", min_size=min_size, max_size=min_size + extra)
    rw, rh = resize_shorter((w, h), p.min_size, p.max_size)
    assert p.fits(rh, rw)
    short, long = sorted((w, h))
    if long / short * min_size <= p.max_size:  # not capped: shorter side is exactly min_size
        assert min(rw, rh) == min_size or short == min_size


@pytest.mark.parametrize("w,h", [(1003, 480), (100, 1000), (4000, 1)])
def test_published_preprocessing_output_is_accepted(w, h):
    p = Preprocess(task="detection", min_size=128, max_size=256)  # detr_shapes_irpe
    x = p(Image.new("RGB", (w, h)))
    assert max(x.shape[1:]) <= 256 and p.fits(*x.shape[1:])  # main: (123, 257), (260, 26)
    assert not p.fits(257, 100) and not p.fits(0, 10)


def test_normalize_keeps_the_array_kind_and_equals_across_kinds():
    """Host backends pass numpy and get numpy (no torch thread pool beside their runtime: torch's
    CPU ops here cost the server a third of its throughput); both kinds give the same bits."""
    from irpe.data.transforms import normalize
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (3, 3, 12, 16), dtype=np.uint8)
    sizes = np.array([[12, 16], [5, 9], [12, 1]])
    host = normalize(pixels, (0.4, 0.5, 0.6), (0.2, 0.3, 0.25), sizes)
    dev = normalize(torch.from_numpy(pixels), (0.4, 0.5, 0.6), (0.2, 0.3, 0.25), sizes)
    assert isinstance(host, np.ndarray) and host.dtype == np.float32
    assert np.array_equal(host, dev.numpy())
    assert (host[1, :, 5:] == 0).all() and (host[1, :, :, 9:] == 0).all()
    assert (host[1, :, :5, :9] != 0).any()
