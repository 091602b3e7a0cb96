"""Issue 20 items 1, 2, 4 at the decoder / preprocessing level (irpe.data.transforms):
high-bit-depth images scaled (not clamped) to 8 bit, EXIF orientation applied at decode, and the
detection resize never producing a side the served models' tensor check refuses."""
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from irpe.data.shapes import SHAPE_CLASSES, render_classification
from irpe.data.transforms import ImageError, Preprocess, load_image, resize_shorter
from tests.helpers import encode


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
