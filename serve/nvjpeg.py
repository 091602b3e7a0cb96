"""Optional GPU decode for the torch backend on CUDA: nvJPEG through torchvision, batched.

``torchvision.io.decode_jpeg(list, device="cuda")`` decodes every JPEG of a request in one
call; the resize (bicubic / bilinear with antialiasing, the geometry of
``irpe.data.transforms.Preprocess``) runs on the GPU too, and the uint8 result stays there for
the backend. Used only when torchvision imports and CUDA is present; a request with any image
it cannot take (not a JPEG, EXIF-rotated, CMYK, over the pixel limit, undecodable) goes the CPU
path, so errors and results there are unchanged. tests/gpu/test_serve_cuda.py bounds the
difference to the CPU path.
"""
from __future__ import annotations

import io
from typing import List, Optional, Sequence, Tuple

import torch

from irpe.data.transforms import MAX_IMAGE_PIXELS, Preprocess, center_crop_box, resize_shorter

__all__ = ["available", "decode_on_device"]

Decoded = Tuple[torch.Tensor, Tuple[int, int]]  # uint8 (3, H, W) on the device, original (h, w)


def available(device: str) -> bool:
    """True on a CUDA device with a torchvision that has ``io.decode_jpeg``."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception:  # no torchvision, or one built without its C++ ops
        return False
    return True


def _plain_jpeg_size(blob: bytes) -> Optional[Tuple[int, int]]:
    """(w, h) of an upright RGB/greyscale JPEG within the pixel limit, else None."""
    from PIL import Image
    if blob[:3] != b"\xff\xd8\xff":
        return None
    try:
        with Image.open(io.BytesIO(blob), formats=("JPEG",)) as image:
            if image.mode not in ("RGB", "L") or image.getexif().get(0x0112, 1) != 1:
                return None
            w, h = image.size
    except Exception:  # undecodable header: the CPU path reports it
        return None
    return (w, h) if w * h <= MAX_IMAGE_PIXELS else None


def _resize(image: torch.Tensor, pre: Preprocess) -> torch.Tensor:
    """uint8 (3, h, w) -> uint8 model input with Preprocess's geometry (on image's device)."""
    h, w = image.shape[-2:]
    x = image[None].float()
    if pre.task == "classification":
        sw, sh = resize_shorter((w, h), int(pre.size / pre.crop_pct))
        x = torch.nn.functional.interpolate(x, size=(sh, sw), mode="bicubic", antialias=True,
                                            align_corners=False)
        left, top, right, bottom = center_crop_box((sw, sh), pre.size)
        x = x[..., top:bottom, left:right]
    else:
        sw, sh = resize_shorter((w, h), pre.min_size, pre.max_size)
        x = torch.nn.functional.interpolate(x, size=(sh, sw), mode="bilinear", antialias=True,
                                            align_corners=False)
    return x.round_().clamp_(0, 255).to(torch.uint8)[0]


def decode_on_device(blobs: Sequence[bytes], pre: Preprocess, device: str
                     ) -> Optional[List[Decoded]]:
    """Every image decoded and resized on ``device``; None when any one must go the CPU path."""
    from torchvision.io import ImageReadMode, decode_jpeg
    found = [_plain_jpeg_size(b) for b in blobs]
    sizes = [s for s in found if s is not None]
    if not blobs or len(sizes) != len(found):
        return None
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    try:
        images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:  # a corrupt stream: the CPU path gives the usual 400
        return None
    out = [(_resize(im, pre), (h, w)) for im, (w, h) in zip(images, sizes, strict=True)]
    # complete before they leave this thread: the batching thread stacks them on its own
    # current stream, and the instance's stream then waits for that one (TorchBackend._consume)
    torch.cuda.current_stream(device).synchronize()
    return out
