"""Box conversions and IoU / generalized IoU (DETR's matching cost and loss)."""
from __future__ import annotations

from typing import Tuple

import torch

__all__ = ["box_cxcywh_to_xyxy", "box_xyxy_to_cxcywh", "box_area", "box_iou",
           "generalized_box_iou"]


def box_cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(cx, cy, w, h) -> (x0, y0, x1, y1) on the last dim."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


def box_xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """(x0, y0, x1, y1) -> (cx, cy, w, h) on the last dim."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], dim=-1)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Areas of xyxy boxes (N,)."""
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pairwise IoU (N, M) and union (N, M) of xyxy boxes."""
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return inter / union, union


def generalized_box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise generalized IoU (Rezatofighi et al. 2019) of xyxy boxes, in [-1, 1]."""
    if not ((a[:, 2:] >= a[:, :2]).all() and (b[:, 2:] >= b[:, :2]).all()):
        raise ValueError("generalized_box_iou needs boxes with x1 >= x0 and y1 >= y0")
    iou, union = box_iou(a, b)
    lt = torch.min(a[:, None, :2], b[None, :, :2])
    rb = torch.max(a[:, None, 2:], b[None, :, 2:])
    hull = (rb - lt).clamp(min=0).prod(-1)
    return iou - (hull - union) / hull
