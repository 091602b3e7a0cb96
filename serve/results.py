"""Model outputs -> REST results: top-k classes, DETR detections (irpe PostProcess) in pixels."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from irpe.models import PostProcess

__all__ = ["classification_results", "detection_results", "top_k_classes"]

_POSTPROCESS = PostProcess()


def top_k_classes(logits: np.ndarray, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax probabilities and indices of the ``k`` best classes per row of (B, C) logits."""
    probs = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32)).softmax(-1)
    return probs.topk(min(k, probs.shape[-1]), dim=-1)


def classification_results(rows: Sequence[Dict[str, np.ndarray]], labels: List[str],
                           top_k: int) -> List[Dict]:
    """Per image: labels, indices and softmax scores of the top-k classes, best first."""
    scores, indices = top_k_classes(np.stack([r["logits"] for r in rows]), top_k)
    return [{"labels": [labels[i] for i in idx], "indices": idx, "scores": sc}
            for sc, idx in zip(scores.tolist(), indices.tolist(), strict=True)]


def detection_results(rows: Sequence[Dict[str, np.ndarray]], sizes: Sequence[Tuple[int, int]],
                      labels: List[str], threshold: float, max_detections: int,
                      box_format: str = "xyxy") -> List[Dict]:
    """Per image: detections with score >= threshold, best first, boxes in the image's pixels."""
    outputs = {k: torch.from_numpy(np.stack([r[k] for r in rows]))
               for k in ("pred_logits", "pred_boxes")}
    per_image = _POSTPROCESS(outputs, torch.tensor([list(s) for s in sizes]))
    return [_image_result(d, size, labels, threshold, max_detections, box_format)
            for d, size in zip(per_image, sizes, strict=True)]


def _image_result(det: Dict[str, torch.Tensor], size: Tuple[int, int], labels: List[str],
                  threshold: float, max_detections: int, box_format: str) -> Dict:
    scores = det["scores"]
    order = scores.argsort(descending=True)
    order = order[scores[order] >= threshold][:max_detections]
    boxes = det["boxes"][order]
    if box_format == "coco":
        boxes = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1)
    found = [{"label": labels[int(c)], "index": int(c), "score": float(s), "box": b}
             for c, s, b in zip(det["labels"][order].tolist(), scores[order].tolist(),
                                boxes.tolist(), strict=True)]
    return {"height": int(size[0]), "width": int(size[1]), "detections": found}
