"""Validation inputs: random tensors plus real images (preprocessed as the model expects).

Classification batches are (B, 3, S, S); detection batches are padded pairs of images of
different sizes with their valid ``sizes``, so padding and dynamic H x W are both exercised.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import torch

from irpe.artifact.trained import ModelSpec
from irpe.errors import InvalidInput, MissingFile
from irpe.models import pad_images

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["Batch", "make_batches", "default_sizes", "image_files", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".ppm")
CLS_BATCH = 4   # classification images per batch (the file has a dynamic batch axis)
DET_BATCH = 2   # detection images per padded batch
SEED = 1234


@dataclass
class Batch:
    """One forward's inputs (torch, CPU), the name of each image and a description."""

    names: List[str]
    feeds: Dict[str, torch.Tensor]
    label: str


def default_sizes(spec: ModelSpec) -> List[Tuple[int, int]]:
    """Three detection input sizes from the model's preprocessing, one square, two not."""
    short = int(spec.preprocess.get("min_size", 800))
    long = min(int(spec.preprocess.get("max_size", 1333)), short * 4 // 3)
    return [(short, long), (long, short), (short * 3 // 4, short * 3 // 4)]


def image_files(image_dir: Optional[StrPath]) -> List[Path]:
    if image_dir is None:
        return []
    folder = Path(image_dir)
    if not folder.is_dir():
        raise MissingFile(f"image folder not found: {folder}")
    files = sorted(p for p in folder.rglob("*")  # class subfolders too (ImageFolder layout)
                   if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise InvalidInput(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {folder} or its "
                           "subfolders")
    return files


def _real_images(spec: ModelSpec, files: Sequence[Path]) -> List[Tuple[str, torch.Tensor]]:
    from irpe.data.transforms import load_image
    transform = spec.transform()
    return [(p.name, transform(load_image(str(p)))) for p in files]


def _random_images(spec: ModelSpec, count: int, size: int,
                   sizes: Sequence[Tuple[int, int]]) -> List[Tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(SEED)
    out = []
    for i in range(count):
        h, w = (size, size) if spec.task == "classification" else sizes[i % len(sizes)]
        out.append((f"random{i}", torch.randn(3, h, w, generator=gen)))
    return out


def make_batches(spec: ModelSpec, num_inputs: int, image_dir: Optional[StrPath] = None,
                 sizes: Optional[Sequence[Tuple[int, int]]] = None,
                 image_size: Optional[int] = None) -> List[Batch]:
    """``num_inputs`` images in total: the folder's images first, random ones after."""
    if num_inputs < 1:
        raise InvalidInput(f"num_inputs must be >= 1, got {num_inputs}")
    sizes = list(sizes) if sizes else default_sizes(spec)
    files = image_files(image_dir)[:num_inputs]
    images = _real_images(spec, files)
    size = image_size or int(spec.preprocess.get("size", 224))
    images += _random_images(spec, num_inputs - len(images), size, sizes)
    step = CLS_BATCH if spec.task == "classification" else DET_BATCH
    batches = []
    for start in range(0, len(images), step):
        names = [name for name, _ in images[start:start + step]]
        tensors = [t for _, t in images[start:start + step]]
        if spec.task == "classification":
            batches.append(Batch(names, {"images": torch.stack(tensors)}, ",".join(names)))
        else:
            padded, valid = pad_images(tensors)
            hw = "; ".join(f"{h}x{w}" for h, w in valid.tolist())
            batches.append(Batch(names, {"images": padded, "sizes": valid},
                                 f"{','.join(names)} ({hw})"))
    return batches
