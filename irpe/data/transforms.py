# Follows the code of facebookresearch/detr (Apache-2.0) and timm (Apache-2.0): see NOTICE.
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
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, Tuple, Union, overload

import numpy as np
import torch

from ..errors import InvalidInput, IrpeError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

Array = Union[np.ndarray, torch.Tensor]  # numpy on the host, torch on any device
Channels = Union[Sequence[float], Array]  # one value per channel (R, G, B)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_IMAGE_PIXELS = 40_000_000  # larger images are refused (decompression bombs)
TASKS = ("classification", "detection")
# formats load_image decodes; PIL would otherwise also try EPS (Ghostscript) and others
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF", "PPM")
# classification resizes the whole image before cropping; past this many pixels (an extreme
# aspect ratio) only the crop's source region is resized, so memory stays bounded
MAX_RESIZED_PIXELS = 1 << 24
# JPEG draft decoding (DCT scaling by 1/2, 1/4 or 1/8) keeps at least this many times the
# resize target on each side, so the final resize still averages over the reduced image
DRAFT_MARGIN = 2
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height
DraftRequest = Callable[[int, int], Optional[Tuple[int, int]]]


class ImageError(IrpeError, ValueError):
    """Bytes that are not a decodable image, or an image too large to decode safely."""


class ImageTooLargeError(ImageError):
    """An image whose header claims more pixels than allowed (refused before decoding)."""


def load_image(source: Union[bytes, str], max_pixels: int = MAX_IMAGE_PIXELS) -> PILImage:
    """Decode bytes or a file path to an RGB PIL image; refuse undecodable input and bombs."""
    return _decode(source, max_pixels, None)[0]


def load_image_for(source: Union[bytes, str], preprocess: "Preprocess",
                   max_pixels: int = MAX_IMAGE_PIXELS) -> Tuple[PILImage, Tuple[int, int]]:
    """Decode for ``preprocess``: a JPEG much larger than the model input is decoded reduced
    (draft mode). Returns (RGB image, upright (width, height) of the full image); give that
    size to ``preprocess(image, size)`` so geometry (and detection boxes) match a full decode."""
    return _decode(source, max_pixels, preprocess.draft_request)


def _decode(source: Union[bytes, str], max_pixels: int, draft: Optional[DraftRequest]
            ) -> Tuple[PILImage, Tuple[int, int]]:
    """(RGB image, upright full (width, height)); JPEGs reduced to ``draft(w, h)`` if given."""
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
            orientation = image.getexif().get(0x0112, 1)  # 274 = Orientation; 1 = upright
            full = (height, width) if orientation in _TRANSPOSED else (width, height)
            if draft is not None and image.format == "JPEG":
                _draft(image, draft(*full), orientation in _TRANSPOSED)
            image.load()
            return to_rgb8(_upright(image, orientation)), full
    except (ImageError, FileNotFoundError):
        raise
    except Image.DecompressionBombError as exc:  # over PIL's own limit, found in the header
        raise ImageTooLargeError(f"image is over the limit of {max_pixels} pixels: {exc}") \
            from None
    except Exception as exc:  # PIL raises many types (UnidentifiedImageError, OSError, ...)
        raise ImageError(f"cannot decode image: {exc}") from None


def _draft(image: PILImage, request: Optional[Tuple[int, int]], transposed: bool) -> None:
    """Let the JPEG decoder scale by 1/2..1/8 while staying at least ``request`` (upright)."""
    if request is not None:
        image.draft(image.mode, request[::-1] if transposed else request)


def _upright(image: PILImage, orientation: Optional[int]) -> PILImage:
    """Apply the EXIF ``orientation`` tag (read once by the caller), so pixels (and boxes)
    are those a viewer displays."""
    from PIL import ImageOps
    return image if orientation in (1, None) else ImageOps.exif_transpose(image)


def to_rgb8(image: PILImage) -> PILImage:
    """Any PIL image -> 8-bit RGB; 16/32-bit and float images are scaled, not clamped at 255.

    PIL's convert("RGB") clips values above 255, so a 16-bit image becomes solid white. 16-bit
    modes are divided by 257 (full range, as image viewers show them); 32-bit integer images
    by the full range of the smallest of 8/16/32 bits that holds their maximum; float images
    are taken as 0..1 when their maximum is at most 1, else scaled like 32-bit integers.
    """
    from PIL import Image
    if image.mode == "RGB":  # convert("RGB") would copy it: already decoded once per request
        return image
    if image.mode not in ("I", "F") and not image.mode.startswith("I;16"):
        return image.convert("RGB")
    values = np.nan_to_num(np.asarray(image, dtype=np.float32), nan=0.0, posinf=0.0,
                           neginf=0.0)
    peak = float(values.max(initial=0.0))
    if image.mode.startswith("I;16"):
        full = 65535.0
    elif image.mode == "F" and peak <= 1.0:
        full = 1.0
    else:
        full = next((f for f in (255.0, 65535.0, 2.0 ** 32 - 1) if peak <= f), peak)
    values *= 255.0 / full
    np.clip(np.rint(values, out=values), 0, 255, out=values)
    return Image.fromarray(values.astype(np.uint8), "L").convert("RGB")


def resize_shorter(size: Tuple[int, int], shorter: int, max_size: int = 0) -> Tuple[int, int]:
    """(width, height) after resizing the shorter side to ``shorter``; with ``max_size`` the
    longer side never exceeds it (DETR's rule, minus its rounding overshoot past the cap)."""
    w, h = size
    short, long = min(w, h), max(w, h)
    if max_size and long / short * shorter > max_size:
        shorter = max(1, int(round(max_size * short / long)))  # DETR's rule; never 0 pixels
        if int(shorter * long / short) > max_size:  # rounding up overshot: round down
            shorter = max(1, int(max_size * short / long))
    new_long = long if short == shorter else int(shorter * long / short)
    if max_size:
        new_long = min(new_long, max_size)  # extreme aspect ratios (1-pixel shorter side)
    return (shorter, new_long) if w < h else (new_long, shorter)


def center_crop_box(size: Tuple[int, int], crop: int) -> Tuple[int, int, int, int]:
    """PIL crop box (left, top, right, bottom) of a centred ``crop`` x ``crop`` square."""
    w, h = size
    left, top = int(round((w - crop) / 2.0)), int(round((h - crop) / 2.0))
    return left, top, left + crop, top + crop


def to_tensor(image: PILImage, mean: Sequence[float] = IMAGENET_MEAN,
              std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """RGB PIL image -> normalised float32 (3, H, W) (:func:`normalize`)."""
    pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)
    return normalize(pixels, mean, std).contiguous()


@overload
def normalize(pixels: np.ndarray, mean: Channels = ..., std: Channels = ...,
              sizes: Optional[Array] = ...) -> np.ndarray: ...


@overload
def normalize(pixels: torch.Tensor, mean: Channels = ..., std: Channels = ...,
              sizes: Optional[Array] = ...) -> torch.Tensor: ...


def normalize(pixels: Array, mean: Channels = IMAGENET_MEAN, std: Channels = IMAGENET_STD,
              sizes: Optional[Array] = None) -> Array:
    """uint8 (..., 3, H, W) pixels -> float32 (x / 255 - mean) / std: the one normalisation of
    training, evaluation and every serving backend. A torch tensor stays a tensor on its device
    (the torch backend, on the GPU); a numpy array stays numpy, so host backends add no torch
    thread pool beside their runtime's. With ``sizes`` (B, 2) = valid (h, w) of each image of a
    padded batch (detection), the padding stays 0."""
    if isinstance(pixels, np.ndarray):
        x = pixels.astype(np.float32)
        x = (x / 255.0 - _per_channel(mean, x)) / _per_channel(std, x)
        if sizes is None:
            return x
        hw, rows, cols = np.asarray(sizes), np.arange(x.shape[-2]), np.arange(x.shape[-1])
        inside = ((rows.reshape(1, -1, 1) < hw[:, 0].reshape(-1, 1, 1))
                  & (cols.reshape(1, 1, -1) < hw[:, 1].reshape(-1, 1, 1)))
        return np.where(inside[:, None], x, 0.0)
    t = pixels.to(torch.float32)
    t = (t / 255.0 - _per_channel(mean, t)) / _per_channel(std, t)
    if sizes is None:
        return t
    hw_t = torch.as_tensor(sizes, device=t.device)
    rows_t = torch.arange(t.shape[-2], device=t.device)
    cols_t = torch.arange(t.shape[-1], device=t.device)
    inside_t = ((rows_t.reshape(1, -1, 1) < hw_t[:, 0].reshape(-1, 1, 1))
                & (cols_t.reshape(1, 1, -1) < hw_t[:, 1].reshape(-1, 1, 1)))
    return torch.where(inside_t[:, None], t, 0.0)


@overload
def _per_channel(values: Channels, like: np.ndarray) -> np.ndarray: ...


@overload
def _per_channel(values: Channels, like: torch.Tensor) -> torch.Tensor: ...


def _per_channel(values: Channels, like: Array) -> Array:
    """Channel values as float32 (3, 1, 1) of ``like``'s kind and device (no copy when there)."""
    if isinstance(like, np.ndarray):
        return np.asarray(values, dtype=np.float32).reshape(-1, 1, 1)
    return torch.as_tensor(values, dtype=torch.float32, device=like.device).view(-1, 1, 1)


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
            raise InvalidInput(f"task must be one of {TASKS}, got {self.task!r}")
        for name in ("size", "min_size", "max_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
        if not _is_number(self.crop_pct) or not 0 < self.crop_pct <= 1:
            raise InvalidInput(f"crop_pct must be a number in (0, 1], got {self.crop_pct!r}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or len(value) != 3 \
                    or not all(map(_is_number, value)):
                raise InvalidInput(f"{name} must be 3 numbers (R, G, B), got {value!r}")
            object.__setattr__(self, name, tuple(value))  # JSON lists -> hashable tuples
        if min(self.std) <= 0:
            raise InvalidInput(f"std must be positive, got {self.std}")

    def __call__(self, image: PILImage,
                 source_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """PIL image -> normalised (3, H, W) tensor for this model; ``source_size`` = (w, h)
        of the full image when ``image`` is a reduced (draft) decode of it."""
        return to_tensor(self.resized(image, source_size), self.mean, self.std)

    def resized(self, image: PILImage,
                source_size: Optional[Tuple[int, int]] = None) -> PILImage:
        """The RGB PIL image the model sees, before normalisation (geometry from
        ``source_size`` when given, so a draft decode gives a full decode's shape)."""
        from PIL import Image
        image = to_rgb8(image)
        size = (source_size[0], source_size[1]) if source_size is not None else image.size
        if self.task == "classification":
            return _resize_crop(image, int(self.size / self.crop_pct), self.size, size)
        return image.resize(resize_shorter(size, self.min_size, self.max_size),
                            Image.Resampling.BILINEAR)

    def draft_request(self, width: int, height: int) -> Optional[Tuple[int, int]]:
        """Smallest (w, h) a JPEG of ``width`` x ``height`` may be decoded at: DRAFT_MARGIN x
        the resize target; None when no reduction is possible (image under 2x that)."""
        if self.task == "classification":
            target = resize_shorter((width, height), int(self.size / self.crop_pct))
        else:
            target = resize_shorter((width, height), self.min_size, self.max_size)
        request = (target[0] * DRAFT_MARGIN, target[1] * DRAFT_MARGIN)
        return request if width >= 2 * request[0] and height >= 2 * request[1] else None

    def fits(self, height: int, width: int) -> bool:
        """Whether a (height, width) input is one this preprocessing can produce (the served
        models' tensor check: detection sides in 1..max_size, classification size x size)."""
        if self.task == "classification":
            return height == width == self.size
        return 1 <= min(height, width) and max(height, width) <= self.max_size

    def to_dict(self) -> Dict:
        """JSON-friendly form (checkpoint / ONNX metadata)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict) -> "Preprocess":
        """Inverse of :meth:`to_dict`; unknown keys and bad values are an InvalidInput (a
        ValueError)."""
        if not isinstance(data, dict):
            raise InvalidInput(f"preprocessing must be a dict, got {type(data).__name__}")
        extra = set(data) - set(cls.__dataclass_fields__)
        if extra:
            raise InvalidInput(f"unknown preprocessing fields: {sorted(extra)}")
        return cls(**data)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value


def _resize_crop(image: PILImage, shorter: int, crop: int,
                 size: Optional[Tuple[int, int]] = None) -> PILImage:
    """Resize the shorter side to ``shorter`` (bicubic), then centre crop ``crop`` x ``crop``;
    geometry from ``size`` (the full image's (w, h)) when given."""
    from PIL import Image
    scaled = resize_shorter(size or image.size, shorter)
    box = center_crop_box(scaled, crop)
    if scaled[0] * scaled[1] <= MAX_RESIZED_PIXELS:
        return image.resize(scaled, Image.Resampling.BICUBIC).crop(box)
    sx, sy = image.width / scaled[0], image.height / scaled[1]
    source = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
    return image.resize((crop, crop), Image.Resampling.BICUBIC, box=source)
