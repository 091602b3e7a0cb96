"""Calibration images for post-training quantisation, read through the model's own
preprocessing: a folder of images (sorted, subfolders too) or the synthetic shapes set.

Shared by the ONNX Runtime / TensorRT quantiser (export/quantize.py) and the OpenVINO one
(export/quantize_openvino.py).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, Iterator, List, Union

import numpy as np

from irpe.errors import InvalidInput, MissingFile

from .inputs import image_files

if TYPE_CHECKING:
    from irpe.artifact.trained import ModelSpec

__all__ = ["SHAPES", "calibration_feeds"]

SHAPES = "shapes"  # --calibration value naming the synthetic shapes set (irpe.data.shapes)


def _shapes_items(spec: ModelSpec, samples: int, seed: int) -> Iterator:
    from irpe.data.datasets import ShapesClassification, ShapesDetection
    tf = spec.transform()
    data: Union[ShapesClassification, ShapesDetection]
    if spec.task == "classification":
        data = ShapesClassification(samples, seed, tf.size, tf, split="train")
    else:
        data = ShapesDetection(samples, seed, transform=tf, split="train")
    for k in range(len(data)):
        yield data[k][0]


def _folder_items(spec: ModelSpec, folder: str, samples: int) -> Iterator:
    from irpe.data.transforms import ImageError, load_image
    files = image_files(folder)[:samples]
    tf = spec.transform()
    for path in files:
        try:
            image = load_image(str(path))
        except ImageError as exc:  # named once: PIL's message names some files, not all
            reason = str(exc).replace(f" {str(path)!r}", "")
            raise ImageError(f"calibration image {path}: {reason}") from None
        yield tf(image)


def calibration_feeds(spec: ModelSpec, calibration: str, samples: int = 64, batch: int = 8,
                      seed: int = 0) -> List[Dict[str, np.ndarray]]:
    """Model inputs for calibration: ``samples`` images of the folder ``calibration`` (sorted,
    subfolders too) or of the shapes training split, preprocessed as the model expects, in
    batches (detection: padded, with their ``sizes``)."""
    import torch

    from irpe.models import pad_images
    if samples < 1 or batch < 1:
        raise InvalidInput(f"calibration samples and batch must be >= 1, got {samples}, "
                           f"{batch}")
    if calibration == SHAPES:
        items = list(_shapes_items(spec, samples, seed))
    elif os.path.isdir(calibration):
        items = list(_folder_items(spec, calibration, samples))
    else:
        raise MissingFile(f"calibration set not found: {calibration} (a folder of images, "
                          f"or '{SHAPES}')")
    feeds = []
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        if spec.task == "classification":
            feeds.append({"images": torch.stack(chunk).numpy()})
        else:
            padded, sizes = pad_images(chunk)
            feeds.append({"images": padded.numpy(), "sizes": sizes.numpy()})
    return feeds
