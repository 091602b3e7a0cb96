# Follows the code of facebookresearch/detr (Apache-2.0): see NOTICE.
"""DETR set loss: cross-entropy (down-weighted "no object"), L1 and GIoU on matched boxes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..box_ops import box_cxcywh_to_xyxy, generalized_box_iou
from .distributed import SINGLE, Dist
from .matcher import HungarianMatcher, Match

DEFAULT_WEIGHTS = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}


@dataclass(frozen=True)
class StepTotals:
    """Counts over a whole optimiser step (every process, every accumulated micro-batch) that
    DETR's loss divides by, and the number of micro-batches (slots) they are spread over.

    Integers, summed exactly, so the normalisers are the same floats however the global batch
    is split: 2 processes x 1 micro-batch and 1 process x 2 micro-batches give equal losses.
    """

    images: int
    boxes: int
    matched: int  # sum over images of min(boxes, queries): the queries that get a target
    slots: int = 1

    @staticmethod
    def local(targets: Sequence[Dict], queries: int) -> "StepTotals":
        """This micro-batch's counts (one slot)."""
        counts = [len(t["labels"]) for t in targets]
        return StepTotals(len(counts), sum(counts), sum(min(c, queries) for c in counts))


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

    def step_totals(self, micro: Sequence[StepTotals]) -> StepTotals:
        """This process's micro-batch counts summed with every other process's (a collective)."""
        mine = [sum(t.images for t in micro), sum(t.boxes for t in micro),
                sum(t.matched for t in micro)]
        images, boxes, matched = (int(v) for v in self.dist.all_sum(mine))
        return StepTotals(images, boxes, matched, len(micro) * self.dist.world)

    def class_weight_sum(self, totals: StepTotals, queries: int) -> float:
        """Sum of the CE weights over every query of the step: matched queries weigh their
        class's weight (1), the others the "no object" weight."""
        no_object = float(self.class_weight[-1])
        return (totals.images * queries - totals.matched) * no_object + float(totals.matched)

    def loss_labels(self, outputs: Dict, targets: List[Dict], matches: List[Match],
                    weight_sum: float) -> torch.Tensor:
        """CE over all queries; unmatched queries are trained towards "no object"."""
        logits = outputs["pred_logits"]
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64,
                                    device=logits.device)
        for i, (src, tgt) in enumerate(matches):
            target_classes[i, src] = targets[i]["labels"][tgt].to(logits.device)
        # weighted mean over all queries of the step: sum(w * ce) / sum(w), the weight sum
        # spread over the slots like num_boxes, so the mean of the slots' gradients (DDP and
        # accumulation) equals one big batch's
        ce = F.cross_entropy(logits.transpose(1, 2).float(), target_classes, self.class_weight,
                             reduction="none")
        return ce.sum() / weight_sum

    def loss_boxes(self, outputs: Dict, targets: List[Dict], matches: List[Match],
                   num_boxes: float) -> Dict[str, torch.Tensor]:
        """L1 and 1 - GIoU of matched boxes, averaged over the number of target boxes."""
        src = torch.cat([outputs["pred_boxes"][i, s] for i, (s, _) in enumerate(matches)])
        tgt = torch.cat([t["boxes"][j]
                         for t, (_, j) in zip(targets, matches, strict=True)]).to(src.device)
        l1 = F.l1_loss(src.float(), tgt, reduction="sum") / num_boxes
        giou = generalized_box_iou(box_cxcywh_to_xyxy(src.float()), box_cxcywh_to_xyxy(tgt))
        return {"loss_bbox": l1, "loss_giou": (1 - torch.diag(giou)).sum() / num_boxes}

    def single(self, outputs: Dict, targets: List[Dict], num_boxes: float,
               weight_sum: float) -> Dict:
        matches = self.matcher(outputs, targets)
        losses = {"loss_ce": self.loss_labels(outputs, targets, matches, weight_sum)}
        losses.update(self.loss_boxes(outputs, targets, matches, num_boxes))
        return losses

    def forward(self, outputs: Dict, targets: List[Dict],
                totals: Optional[StepTotals] = None) -> Dict[str, torch.Tensor]:
        """Unweighted losses by name (aux ones suffixed _0, _1, ...) and the weighted ``loss``.

        ``totals``: the step's counts (:meth:`step_totals`); by default this call's targets on
        every process (one micro-batch per process). The normalisers are per slot: DETR's
        num_boxes rule (boxes of the step / slots, at least 1), also for the weighted CE.
        """
        queries = outputs["pred_logits"].shape[1]
        if totals is None:
            totals = self.step_totals([StepTotals.local(targets, queries)])
        num_boxes = max(totals.boxes / totals.slots, 1.0)
        weight_sum = self.class_weight_sum(totals, queries) / totals.slots
        losses = self.single(outputs, targets, num_boxes, weight_sum)
        for k, aux in enumerate(outputs.get("aux_outputs", [])):
            aux_losses = self.single(aux, targets, num_boxes, weight_sum)
            losses.update({f"{n}_{k}": v for n, v in aux_losses.items()})
        losses["loss"] = sum(self.weights[n.rsplit("_", 1)[0] if n[-1].isdigit() else n] * v
                             for n, v in losses.items())
        return losses
