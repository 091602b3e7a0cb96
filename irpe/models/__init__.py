"""Model families and the registry; importing this module registers every model."""
from . import deit  # noqa: F401  (registers the DeiT family)
from .deit import VisionTransformer
from .registry import ModelInfo, create_model, list_models, model_info, register_model

__all__ = ["VisionTransformer", "ModelInfo", "create_model", "list_models", "model_info",
           "register_model"]
