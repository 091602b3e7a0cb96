"""Data: the one preprocessing function, synthetic "shapes" datasets, dataset readers.

The shapes and dataset names are imported on first use, so ``import irpe.data`` stays light.
"""
import importlib

from .transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageError,
    ImageTooLargeError,
    Preprocess,
    load_image,
)

_LAZY = {
    "SHAPE_CLASSES": "shapes", "render_classification": "shapes", "render_detection": "shapes",
    "write_classification": "shapes", "write_detection": "shapes",
    "ImageFolder": "datasets", "ShapesClassification": "datasets", "CocoDetection": "datasets",
    "ShapesDetection": "datasets", "collate_detection": "datasets",
}

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImageError", "ImageTooLargeError", "Preprocess",
           "load_image", *_LAZY]


def __getattr__(name: str):
    """Import the module defining ``name`` on first access (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
