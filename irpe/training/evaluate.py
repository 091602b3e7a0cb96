"""Evaluation: top-1/top-5 for classifiers, COCO mAP (pycocotools) for detectors."""
from __future__ import annotations

import contextlib
import io
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Union, overload

import torch
from torch import nn

from ..errors import InvalidInput
from ..models.detr import PostProcess
from .distributed import SINGLE, Dist, ShardSampler, batches

if TYPE_CHECKING:  # the data sets are imported where they are read
    from ..data.datasets import CocoDetection, ShapesDetection
    from ..runtime.base import RuntimeFile

__all__ = ["topk_accuracy", "evaluate_classification", "coco_map", "detections_to_coco",
           "evaluate_detection", "FileModel"]

# what the loops evaluate: a torch model, or an exported file run by ONNX Runtime or OpenVINO
Evaluated = Union[nn.Module, "FileModel"]

COCO_STATS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm",
              "ARl")


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, ks: Sequence[int] = (1, 5)
                  ) -> Dict[int, int]:
    """Number of samples whose label is among the top-k logits, for each k (k capped at C)."""
    top = logits.topk(min(max(ks), logits.shape[-1]), dim=-1).indices
    hit = top == labels.view(-1, 1)
    return {k: int(hit[:, :k].any(-1).sum()) for k in ks}


@torch.no_grad()
def evaluate_classification(model: Evaluated, loader: Iterable, device: str = "cpu",
                            dist: Dist = SINGLE) -> Dict[str, float]:
    """Top-1 / top-5 accuracy (percent) and mean cross-entropy over a loader of (x, y).

    Under torchrun each rank sees its shard; the counts are summed over ranks (exact).
    """
    model.eval()
    total: float  # a count; the sum over ranks below comes back as a float
    hits, total, loss = {1: 0, 5: 0}, 0, 0.0
    for images, labels in batches(loader):
        logits = model(images.to(device)).float().cpu()
        loss += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
        for k, n in topk_accuracy(logits, labels).items():
            hits[k] += n
        total += labels.numel()
    top1, top5, total, loss = dist.all_sum([hits[1], hits[5], total, loss])
    if total == 0:
        raise InvalidInput("evaluation set is empty")
    return {"top1": 100.0 * top1 / total, "top5": 100.0 * top5 / total,
            "loss": loss / total, "images": int(total)}


def detections_to_coco(results: List[Dict[str, torch.Tensor]], image_ids: Sequence[int],
                       category_ids: Sequence[int]) -> List[Dict]:
    """PostProcess output (xyxy pixels, contiguous labels) -> COCO result dicts (xywh)."""
    out = []
    for res, image_id in zip(results, image_ids, strict=True):
        if len(res["labels"]) and int(res["labels"].max()) >= len(category_ids):
            raise InvalidInput(f"model label {int(res['labels'].max())} has no dataset category "
                               f"({len(category_ids)} categories)")
        boxes = res["boxes"].float().tolist()
        for (x0, y0, x1, y1), score, label in zip(boxes, res["scores"].tolist(),
                                                   res["labels"].tolist(), strict=True):
            out.append({"image_id": int(image_id), "category_id": int(category_ids[label]),
                        "bbox": [x0, y0, x1 - x0, y1 - y0], "score": float(score)})
    return out


def coco_map(ground_truth: Dict, results: List[Dict]) -> Dict[str, float]:
    """COCO box metrics (pycocotools COCOeval) of ``results`` against a ground-truth dict."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    if not results:
        return {name: 0.0 for name in COCO_STATS}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        gt = COCO()
        gt.dataset = {k: v for k, v in ground_truth.items()}
        gt.dataset.setdefault("info", {})
        gt.createIndex()
        dt = gt.loadRes(results)
        ev = COCOeval(gt, dt, iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {name: max(float(v), 0.0) for name, v in zip(COCO_STATS, ev.stats, strict=True)}


@torch.no_grad()
def evaluate_detection(model: Evaluated, dataset: Union[ShapesDetection, CocoDetection],
                       batch_size: int = 16, device: str = "cpu",
                       category_ids: Optional[Sequence[int]] = None, dist: Dist = SINGLE
                       ) -> Dict[str, float]:
    """COCO mAP of a DETR model on a detection dataset with ``coco_json()``/``category_ids``.

    ``category_ids[label]`` is the dataset id of the model's label (default: the dataset's own
    order). Under torchrun each rank detects on its shard; rank 0 scores the gathered results.
    """
    from torch.utils.data import DataLoader

    from ..data.datasets import collate_detection
    model.eval()
    post = PostProcess()
    ids = dataset.category_ids if category_ids is None else list(category_ids)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_detection,
                        sampler=ShardSampler(len(dataset), dist))
    results = []
    for images, sizes, targets in loader:
        outputs = model(images.to(device), sizes.to(device))
        outputs = {k: v.float().cpu() for k, v in outputs.items() if k != "aux_outputs"}
        orig = torch.stack([t["orig_size"] for t in targets])
        results += detections_to_coco(post(outputs, orig), [t["image_id"] for t in targets], ids)
    gathered = dist.gather(results)
    metrics = None
    if dist.main and gathered is not None:  # (rank 0 gets the list, the others None)
        metrics = coco_map(dataset.coco_json(), [r for part in gathered for r in part])
        metrics["images"] = len(dataset)
    return dist.broadcast(metrics)


class FileModel:
    """A file opened on its runtime (:class:`irpe.runtime.base.RuntimeFile`), called where the
    evaluation loops call a PyTorch model: ``model(images)`` -> logits, ``model(images,
    sizes)`` -> DETR outputs. Inputs are read to the host whatever the device."""

    def __init__(self, file: "RuntimeFile") -> None:
        self.file = file
        self.spec, self.precision, self.description = file.spec, file.precision, file.description

    def eval(self) -> "FileModel":
        return self

    def to(self, device: Union[str, torch.device]) -> "FileModel":
        """The runtime runs where it was opened whatever the device: inputs are read to host."""
        return self

    @overload
    def __call__(self, images: torch.Tensor, sizes: None = None) -> torch.Tensor: ...

    @overload
    def __call__(self, images: torch.Tensor, sizes: torch.Tensor) -> Dict[str, torch.Tensor]: ...

    def __call__(self, images: torch.Tensor, sizes: Optional[torch.Tensor] = None
                 ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        feeds = self.file.feeds(images.float().cpu().numpy(),
                                None if sizes is None else sizes.cpu().numpy())
        out = {k: torch.from_numpy(v) for k, v in self.file.run(feeds).items()}
        return out["logits"] if "logits" in out else out
