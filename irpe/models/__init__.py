"""Model families and the registry; importing this module registers every model."""
from . import deit, detr  # noqa: F401  (importing registers the families)
from .deit import VisionTransformer
from .detr import DETR, PostProcess, pad_images
from .registry import ModelInfo, create_model, list_models, model_info, register_model

__all__ = ["VisionTransformer", "DETR", "PostProcess", "pad_images", "ModelInfo", "create_model",
           "list_models", "model_info", "register_model"]
