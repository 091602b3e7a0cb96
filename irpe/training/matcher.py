# Follows the code of facebookresearch/detr (Apache-2.0): see NOTICE.
"""Hungarian matching of DETR predictions to ground truth (one-to-one, scipy)."""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

from ..box_ops import box_cxcywh_to_xyxy, generalized_box_iou

Match = Tuple[torch.Tensor, torch.Tensor]  # (prediction indices, target indices), int64


class HungarianMatcher(nn.Module):
    """Minimum-cost assignment with cost = w_class * -p(class) + w_bbox * L1 + w_giou * -GIoU."""

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0,
                 cost_giou: float = 2.0) -> None:
        super().__init__()
        if cost_class == cost_bbox == cost_giou == 0:
            raise ValueError("all matching costs are 0")
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou

    def cost_matrix(self, logits: torch.Tensor, boxes: torch.Tensor,
                    target: Dict[str, torch.Tensor]) -> torch.Tensor:
        """(Q, N) matching cost of one image's Q predictions against its N targets."""
        prob = logits.softmax(-1)
        cost_class = -prob[:, target["labels"]]
        cost_bbox = torch.cdist(boxes, target["boxes"], p=1)
        cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(boxes),
                                         box_cxcywh_to_xyxy(target["boxes"]))
        return (self.cost_bbox * cost_bbox + self.cost_class * cost_class
                + self.cost_giou * cost_giou)

    @torch.no_grad()
    def forward(self, outputs: Dict[str, torch.Tensor],
                targets: List[Dict[str, torch.Tensor]]) -> List[Match]:
        """Per image, the matched (prediction, target) index pairs, sorted by prediction."""
        from scipy.optimize import linear_sum_assignment
        logits, boxes = outputs["pred_logits"].float(), outputs["pred_boxes"].float()
        matches = []
        for i, target in enumerate(targets):
            if target["labels"].numel() == 0:
                empty = torch.empty(0, dtype=torch.int64)
                matches.append((empty, empty))
                continue
            cost = self.cost_matrix(logits[i], boxes[i], target).cpu()
            rows, cols = linear_sum_assignment(cost.numpy())
            matches.append((torch.as_tensor(rows, dtype=torch.int64),
                            torch.as_tensor(cols, dtype=torch.int64)))
        return matches
