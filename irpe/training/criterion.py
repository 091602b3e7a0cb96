"""DETR set loss: cross-entropy (down-weighted "no object"), L1 and GIoU on matched boxes."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..box_ops import box_cxcywh_to_xyxy, generalized_box_iou
from .distributed import SINGLE, Dist
from .matcher import HungarianMatcher, Match

DEFAULT_WEIGHTS = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}


class SetCriterion(nn.Module):
    """Hungarian-matched losses of the last decoder layer, plus the same for aux outputs."""

    class_weight: torch.Tensor  # buffer: CE weight per class, "no object" last

    def __init__(self, num_classes: int, matcher: HungarianMatcher,
                 weights: Optional[Dict[str, float]] = None, eos_coef: float = 0.1,
                 dist: Dist = SINGLE) -> None:
        super().__init__()
        self.dist = dist
        self.num_classes, self.matcher = num_classes, matcher
        self.weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        class_weight = torch.ones(num_classes + 1)
        class_weight[-1] = eos_coef
        self.register_buffer("class_weight", class_weight)

    def mean(self, value: float) -> float:
        """Mean of a per-rank normaliser over ranks (DETR's num_boxes rule); itself on one."""
        return self.dist.all_sum([value])[0] / self.dist.world

    def loss_labels(self, outputs: Dict, targets: List[Dict], matches: List[Match]) -> torch.Tensor:
        """CE over all queries; unmatched queries are trained towards "no object"."""
        logits = outputs["pred_logits"]
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64,
                                    device=logits.device)
        for i, (src, tgt) in enumerate(matches):
            target_classes[i, src] = targets[i]["labels"][tgt].to(logits.device)
        # weighted mean over all queries of all ranks: sum(w * ce) / sum(w), the weight sum
        # averaged over ranks like num_boxes, so DDP's gradient mean equals one big batch
        ce = F.cross_entropy(logits.transpose(1, 2).float(), target_classes, self.class_weight,
                             reduction="none")
        return ce.sum() / self.mean(float(self.class_weight[target_classes].sum()))

    def loss_boxes(self, outputs: Dict, targets: List[Dict], matches: List[Match],
                   num_boxes: float) -> Dict[str, torch.Tensor]:
        """L1 and 1 - GIoU of matched boxes, averaged over the number of target boxes."""
        src = torch.cat([outputs["pred_boxes"][i, s] for i, (s, _) in enumerate(matches)])
        tgt = torch.cat([t["boxes"][j]
                         for t, (_, j) in zip(targets, matches, strict=True)]).to(src.device)
        l1 = F.l1_loss(src.float(), tgt, reduction="sum") / num_boxes
        giou = generalized_box_iou(box_cxcywh_to_xyxy(src.float()), box_cxcywh_to_xyxy(tgt))
        return {"loss_bbox": l1, "loss_giou": (1 - torch.diag(giou)).sum() / num_boxes}

    def single(self, outputs: Dict, targets: List[Dict], num_boxes: float) -> Dict:
        matches = self.matcher(outputs, targets)
        losses = {"loss_ce": self.loss_labels(outputs, targets, matches)}
        losses.update(self.loss_boxes(outputs, targets, matches, num_boxes))
        return losses

    def forward(self, outputs: Dict, targets: List[Dict]) -> Dict[str, torch.Tensor]:
        """Unweighted losses by name (aux ones suffixed _0, _1, ...) and the weighted ``loss``."""
        num_boxes = max(self.mean(float(sum(len(t["labels"]) for t in targets))), 1.0)
        losses = self.single(outputs, targets, num_boxes)
        for k, aux in enumerate(outputs.get("aux_outputs", [])):
            losses.update({f"{n}_{k}": v for n, v in self.single(aux, targets, num_boxes).items()})
        losses["loss"] = sum(self.weights[n.rsplit("_", 1)[0] if n[-1].isdigit() else n] * v
                             for n, v in losses.items())
        return losses
