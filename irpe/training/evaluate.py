"""Evaluation: top-1/top-5 for classifiers, COCO mAP (pycocotools) for detectors."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Union, overload

import numpy as np
import torch
from torch import nn

from ..errors import InvalidInput
from ..models.detr import PostProcess
from ..runtime.onnxruntime.session import OrtOptions
from ..runtime.openvino.session import OvOptions
from .distributed import SINGLE, Dist, ShardSampler

if TYPE_CHECKING:  # the data sets are imported where they are read
    from ..data.datasets import CocoDetection, ShapesDetection

__all__ = ["topk_accuracy", "evaluate_classification", "coco_map", "detections_to_coco",
           "evaluate_detection", "RuntimeModel", "OnnxModel", "OpenVINOModel"]

# what the loops evaluate: a torch model, or an exported file run by ONNX Runtime or OpenVINO
Evaluated = Union[nn.Module, "RuntimeModel"]

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
    for images, labels in loader:
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


class RuntimeModel:
    """A file run by an inference runtime, called where the evaluation loops call a PyTorch
    model: ``model(images)`` -> logits, ``model(images, sizes)`` -> DETR outputs. Inputs are
    read to the host whatever the device; subclasses run one batch of numpy feeds."""

    def eval(self) -> "RuntimeModel":
        return self

    def to(self, device: Union[str, torch.device]) -> "RuntimeModel":
        """The runtime runs on the CPU whatever the device: inputs are read to host."""
        return self

    def run(self, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The file's outputs by name for one batch of host inputs."""
        raise NotImplementedError

    @overload
    def __call__(self, images: torch.Tensor, sizes: None = None) -> torch.Tensor: ...

    @overload
    def __call__(self, images: torch.Tensor, sizes: torch.Tensor) -> Dict[str, torch.Tensor]: ...

    def __call__(self, images: torch.Tensor, sizes: Optional[torch.Tensor] = None
                 ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        feeds = {"images": images.float().cpu().numpy()}
        if sizes is not None:
            feeds["sizes"] = sizes.cpu().numpy().astype("int64")
        out = {k: torch.from_numpy(v) for k, v in self.run(feeds).items()}
        return out["logits"] if "logits" in out else out


class OnnxModel(RuntimeModel):
    """An exported (or quantised) ONNX file run by ONNX Runtime (:class:`RuntimeModel`)."""

    def __init__(self, path: str, threads: Optional[int] = None,
                 ort_options: Optional[OrtOptions] = None) -> None:
        from ..artifact.contract import onnx_precision, read_onnx_props, read_onnx_spec
        from ..runtime.onnxruntime.session import create_session
        self.spec = read_onnx_spec(path)
        self.precision = onnx_precision(read_onnx_props(path))
        self.session, self.ops = create_session(path, threads=threads, options=ort_options)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(None, feeds), strict=True))


class OpenVINOModel(RuntimeModel):
    """An exported .onnx or an OpenVINO IR (.xml) compiled by OpenVINO's CPU plugin
    (irpe.runtime.openvino.session, :class:`RuntimeModel`); ``options`` set the precision
    (fp32 / bf16) and threads."""

    def __init__(self, path: Union[str, "os.PathLike[str]"],
                 options: Optional[OvOptions] = None) -> None:
        from ..artifact.contract import onnx_precision, read_onnx_props, read_onnx_spec
        from ..artifact.openvino_ir import is_ir, read_ir_props, read_ir_spec
        from ..runtime.openvino.session import compile_model, compiled_precision
        path = Path(path)
        ir = is_ir(path)
        self.spec = read_ir_spec(path) if ir else read_onnx_spec(path)
        file_precision = onnx_precision(read_ir_props(path) if ir else read_onnx_props(path))
        self.compiled, self.description = compile_model(path, options)
        self.precision = ("int8" if file_precision == "int8"
                          else compiled_precision(self.compiled))
        self.request = self.compiled.create_infer_request()

    def run(self, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        got = self.request.infer(feeds, share_outputs=False)
        return {o.get_any_name(): got[o] for o in self.compiled.outputs}
