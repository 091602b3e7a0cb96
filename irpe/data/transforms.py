"""The one image preprocessing used by training, evaluation, export validation and serving.

Classification follows timm/DeiT eval: resize the shorter side to ``int(size / crop_pct)``
(PIL bicubic), centre crop ``size``, scale to [0, 1], normalise. Detection follows DETR eval:
resize the shorter side to ``min_size`` with the longer side capped at ``max_size`` (PIL
bilinear), normalise; boxes come back normalised to the resized image, hence to the original.
"""
from __future__ import annotations

import io
import numbers
from dataclasses import asdict, dataclass, field
from typing import Dict, Tuple, Union

import numpy as np
import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_IMAGE_PIXELS = 40_000_000  # larger images are refused (decompression bombs)
TASKS = ("classification", "detection")
# formats load_image decodes; PIL would otherwise also try EPS (Ghostscript) and others
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF", "PPM")
# classification resizes the whole image before cropping; past this many pixels (an extreme
# aspect ratio) only the crop's source region is resized, so memory stays bounded
MAX_RESIZED_PIXELS = 1 << 24


class ImageError(ValueError):
    """Bytes that are not a decodable image, or an image too large to decode safely."""


class ImageTooLargeError(ImageError):
    """An image whose header claims more pixels than allowed (refused before decoding)."""


def load_image(source: Union[bytes, str], max_pixels: int = MAX_IMAGE_PIXELS):
    """Decode bytes or a file path to an RGB PIL image; refuse undecodable input and bombs."""
    from PIL import Image
    if isinstance(source, (bytes, bytearray)) and not source:
        raise ImageError("empty image data")
    fp = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    try:
        with Image.open(fp, formats=IMAGE_FORMATS) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise ImageTooLargeError(f"image of {width}x{height} pixels is over the limit "
                                         f"of {max_pixels} pixels")
            image.load()
            return image.convert("RGB")
    except (ImageError, FileNotFoundError):
        raise
    except Image.DecompressionBombError as exc:  # over PIL's own limit, found in the header
        raise ImageTooLargeError(f"image is over the limit of {max_pixels} pixels: {exc}") \
            from None
    except Exception as exc:  # PIL raises many types (UnidentifiedImageError, OSError, ...)
        raise ImageError(f"cannot decode image: {exc}") from None


def resize_shorter(size: Tuple[int, int], shorter: int, max_size: int = 0) -> Tuple[int, int]:
    """(width, height) after resizing the shorter side to ``shorter`` (longer capped if set)."""
    w, h = size
    short, long = min(w, h), max(w, h)
    if max_size and long / short * shorter > max_size:
        shorter = max(1, int(round(max_size * short / long)))  # DETR's rule; never 0 pixels
    if short == shorter:
        return w, h
    if w < h:
        return shorter, int(shorter * h / w)
    return int(shorter * w / h), shorter


def center_crop_box(size: Tuple[int, int], crop: int) -> Tuple[int, int, int, int]:
    """PIL crop box (left, top, right, bottom) of a centred ``crop`` x ``crop`` square."""
    w, h = size
    left, top = int(round((w - crop) / 2.0)), int(round((h - crop) / 2.0))
    return left, top, left + crop, top + crop


def to_tensor(image, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """RGB PIL image -> normalised float32 (3, H, W)."""
    array = np.asarray(image, dtype=np.float32) / 255.0
    array = (array - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


@dataclass(frozen=True)
class Preprocess:
    """Eval preprocessing of one model; stored in checkpoints, ONNX metadata and serving."""

    task: str = "classification"
    size: int = 224          # classification: crop size
    crop_pct: float = 0.875  # classification: resize to int(size / crop_pct) first
    min_size: int = 800      # detection: shorter side
    max_size: int = 1333     # detection: cap on the longer side
    mean: Tuple[float, ...] = field(default=IMAGENET_MEAN)
    std: Tuple[float, ...] = field(default=IMAGENET_STD)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        for name in ("size", "min_size", "max_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not _is_number(self.crop_pct) or not 0 < self.crop_pct <= 1:
            raise ValueError(f"crop_pct must be a number in (0, 1], got {self.crop_pct!r}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or len(value) != 3 \
                    or not all(map(_is_number, value)):
                raise ValueError(f"{name} must be 3 numbers (R, G, B), got {value!r}")
            object.__setattr__(self, name, tuple(value))  # JSON lists -> hashable tuples
        if min(self.std) <= 0:
            raise ValueError(f"std must be positive, got {self.std}")

    def __call__(self, image) -> torch.Tensor:
        """PIL image -> normalised (3, H, W) tensor for this model."""
        from PIL import Image
        image = image.convert("RGB")
        if self.task == "classification":
            image = _resize_crop(image, int(self.size / self.crop_pct), self.size)
        else:
            scaled = resize_shorter(image.size, self.min_size, self.max_size)
            image = image.resize(scaled, Image.BILINEAR)
        return to_tensor(image, self.mean, self.std)

    def to_dict(self) -> Dict:
        """JSON-friendly form (checkpoint / ONNX metadata)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict) -> "Preprocess":
        """Inverse of :meth:`to_dict`; unknown keys and bad values are a ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"preprocessing must be a dict, got {type(data).__name__}")
        extra = set(data) - set(cls.__dataclass_fields__)
        if extra:
            raise ValueError(f"unknown preprocessing fields: {sorted(extra)}")
        return cls(**data)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value


def _resize_crop(image, shorter: int, crop: int):
    """Resize the shorter side to ``shorter`` (bicubic), then centre crop ``crop`` x ``crop``."""
    from PIL import Image
    scaled = resize_shorter(image.size, shorter)
    box = center_crop_box(scaled, crop)
    if scaled[0] * scaled[1] <= MAX_RESIZED_PIXELS:
        return image.resize(scaled, Image.BICUBIC).crop(box)
    sx, sy = image.width / scaled[0], image.height / scaled[1]
    source = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
    return image.resize((crop, crop), Image.BICUBIC, box=source)
