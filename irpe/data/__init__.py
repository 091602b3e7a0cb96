"""Data: the one preprocessing function, synthetic "shapes" datasets, dataset readers."""
from .transforms import IMAGENET_MEAN, IMAGENET_STD, Preprocess, load_image

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Preprocess", "load_image"]
