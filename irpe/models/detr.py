# Follows the code of facebookresearch/detr (Apache-2.0) and microsoft/Cream iRPE
# (MIT): see NOTICE.
"""DETR detectors with iRPE in the encoder (keys as facebookresearch/detr + official iRPE-DETR).

Registered: ``detr_resnet50`` (no iRPE), ``detr_resnet50_irpe`` (rpe-2.0-product-ctx-1-k, the
published 150/300-epoch model) and ``detr_tiny_irpe`` (ResNet-18-like at 1/4 width, 2+2 layers,
d=64) for tests and demos. Images of one batch are padded bottom/right; ``sizes`` gives each
image's valid (h, w) so every image gets the detections it would get alone.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..box_ops import box_cxcywh_to_xyxy
from ..rpe import RPEConfig
from .backbone import Backbone, resnet_layers
from .registry import register_model
from .transformer import PositionEmbeddingSine, Transformer

__all__ = ["DETR", "MLP", "PostProcess", "box_cxcywh_to_xyxy", "pad_images"]


class MLP(nn.Module):
    """Plain multi-layer perceptron (DETR's bbox head; keys layers.{i})."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b)
                                    for a, b in zip(dims, dims[1:] + [output_dim], strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < len(self.layers) - 1 else layer(x)
        return x


class DETR(nn.Module):
    """ResNet backbone -> 1x1 input_proj -> transformer -> class and box heads (+ aux outputs)."""

    def __init__(self, num_classes: int = 91, num_queries: int = 100, depth: int = 50,
                 widths: Sequence[int] = (64, 128, 256, 512), d_model: int = 256, nhead: int = 8,
                 enc_layers: int = 6, dec_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, rpe_config: Optional[RPEConfig] = None,
                 aux_loss: bool = True, norm: str = "frozen") -> None:
        super().__init__()
        if rpe_config is not None and rpe_config.skip != 0:
            raise ValueError("DETR has no cls token: iRPE skip must be 0")
        block, layers = resnet_layers(depth)
        self.num_classes, self.num_queries, self.aux_loss = num_classes, num_queries, aux_loss
        self.rpe_config = rpe_config
        body = Backbone(block, layers, widths, norm)
        self.backbone = nn.Sequential(body, PositionEmbeddingSine(d_model // 2))
        self.input_proj = nn.Conv2d(body.num_channels, d_model, kernel_size=1)
        self.query_embed = nn.Embedding(num_queries, d_model)
        self.transformer = Transformer(d_model, nhead, enc_layers, dec_layers, dim_feedforward,
                                       dropout, rpe_config)
        self.class_embed = nn.Linear(d_model, num_classes + 1)  # + "no object"
        self.bbox_embed = MLP(d_model, d_model, 4, 3)

    def forward(self, images: torch.Tensor, sizes: Optional[torch.Tensor] = None) -> Dict:
        """images (B, 3, H, W) padded bottom/right; sizes (B, 2) valid (h, w); None = no padding.

        Returns pred_logits (B, Q, classes+1), pred_boxes (B, Q, 4) as cx, cy, w, h relative to
        each image's valid size, and aux_outputs of the earlier decoder layers.
        """
        if sizes is not None:
            sizes = sizes.to(images.device)
        feats, mask = self.backbone[0](images, sizes)
        pos = self.backbone[1](mask).to(feats.dtype)
        hs = self.transformer(self.input_proj(feats), mask, self.query_embed.weight, pos)
        logits, boxes = self.class_embed(hs), self.bbox_embed(hs).sigmoid()
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b}
                                  for a, b in zip(logits[:-1], boxes[:-1], strict=True)]
        return out


class PostProcess(nn.Module):
    """DETR outputs -> per image scores, labels and xyxy boxes in pixels of the given sizes."""

    @torch.no_grad()
    def forward(self, outputs: Dict, sizes: torch.Tensor) -> List[Dict[str, torch.Tensor]]:
        """sizes (B, 2) = (height, width) in pixels of the images the boxes should refer to."""
        prob = outputs["pred_logits"].softmax(-1)[..., :-1]
        scores, labels = prob.max(-1)
        h, w = sizes.unbind(1)
        scale = torch.stack([w, h, w, h], dim=1).unsqueeze(1).to(prob.dtype)
        boxes = box_cxcywh_to_xyxy(outputs["pred_boxes"]) * scale
        return [{"scores": s, "labels": lab, "boxes": b}
                for s, lab, b in zip(scores, labels, boxes, strict=True)]


def pad_images(images: Sequence[torch.Tensor], stride: int = 1) -> tuple:
    """Stack (3, h_i, w_i) images top-left into a zero-padded batch; returns (batch, sizes)."""
    if not images:
        raise ValueError("pad_images needs at least one image")
    height = max(int(im.shape[-2]) for im in images)
    width = max(int(im.shape[-1]) for im in images)
    height, width = -(-height // stride) * stride, -(-width // stride) * stride
    batch = images[0].new_zeros((len(images), images[0].shape[0], height, width))
    for i, im in enumerate(images):
        batch[i, :, :im.shape[-2], :im.shape[-1]] = im
    sizes = torch.tensor([[im.shape[-2], im.shape[-1]] for im in images])
    return batch, sizes


_DETR_RPE = "rpe-2.0-product-ctx-1-k"
_R50 = dict(depth=50, widths=(64, 128, 256, 512), d_model=256, nhead=8, enc_layers=6,
            dec_layers=6, dim_feedforward=2048, num_queries=100, num_classes=91)
_TINY = dict(depth=18, widths=(16, 32, 64, 128), d_model=64, nhead=4, enc_layers=2,
             dec_layers=2, dim_feedforward=128, num_queries=20, num_classes=8, dropout=0.0)
# demo detector for the synthetic shapes set: 3 ResNet-18 stages (stride 16 -> 8x8 at 128 px)
_SHAPES = dict(depth=18, widths=(32, 64, 128), d_model=128, nhead=4, enc_layers=2, dec_layers=2,
               dim_feedforward=256, num_queries=16, num_classes=8, dropout=0.0)
_VARIANTS = {
    "detr_resnet50": (_R50, None),
    "detr_resnet50_irpe": (_R50, _DETR_RPE),
    "detr_tiny_irpe": (_TINY, _DETR_RPE),
    "detr_shapes_irpe": (_SHAPES, _DETR_RPE),
}
_DEMO: Dict[str, Dict[str, Any]] = {
    "detr_shapes_irpe": dict(preprocess=dict(task="detection", min_size=128, max_size=256),
                             weights="detr_shapes_irpe.safetensors")}


for _name, (_base, _rpe) in _VARIANTS.items():
    _config: Dict[str, Any] = dict(_base, rpe_config=RPEConfig.from_string(_rpe) if _rpe else None)
    register_model(_name, family="detr", config=_config, **_DEMO.get(_name, {}))(
        functools.partial(DETR, **_config))
