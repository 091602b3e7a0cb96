"""What differs between classification and detection training: data, model, loss, metrics."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Type, Union, cast

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..artifact.trained import default_spec
from ..errors import InvalidInput
from ..models import create_model, model_info
from .config import TASK_NAMES, TrainConfig
from .criterion import SetCriterion, StepTotals
from .distributed import SINGLE, Dist, ResumableSampler, ShardSampler
from .evaluate import evaluate_classification, evaluate_detection
from .matcher import HungarianMatcher
from .optim import mixup_cutmix, soft_cross_entropy

if TYPE_CHECKING:  # the data sets are imported inside the tasks (heavy)
    from ..data.datasets import CocoDetection, ImageFolder, ShapesClassification, ShapesDetection

SHAPES = "shapes"  # --data shapes: the synthetic set generated in memory
Batch = Tuple[Any, ...]  # a loader batch: (images, labels) or (images, sizes, targets)


def random_hflip(images: torch.Tensor, sizes: Optional[torch.Tensor],
                 flip: torch.Tensor) -> torch.Tensor:
    """Mirror the valid region of each image whose ``flip`` entry is true."""
    images = images.clone()
    for i in torch.nonzero(flip).flatten().tolist():
        h, w = (int(v) for v in sizes[i]) if sizes is not None else images.shape[-2:]
        images[i, :, :h, :w] = images[i, :, :h, :w].flip(-1)
    return images


class StepCoins:
    """Horizontal-flip coins of one global batch, drawn once per optimiser step.

    Every process draws the whole global batch's coins from the same generator and each
    micro-batch keeps its slot's share (slot s holds samples s, s + S, ... of the global batch,
    as the sampler deals them), so any split into processes x accumulated micro-batches flips
    exactly the images one process with the whole batch would.
    """

    def __init__(self, gen: torch.Generator, p: float, dist: Dist = SINGLE,
                 accum: int = 1) -> None:
        self.gen, self.p, self.dist, self.accum = gen, p, dist, accum
        self.coins = torch.empty(0)

    def draw(self, batch: int) -> None:
        """New coins for a step whose micro-batches hold ``batch`` images each."""
        self.coins = torch.rand(batch * self.dist.world * self.accum, generator=self.gen)

    def flips(self, micro: int) -> torch.Tensor:
        """The flip mask of this process's ``micro``-th micro-batch of the step."""
        slots = self.dist.world * self.accum
        return self.coins[self.dist.rank * self.accum + micro::slots] < self.p


def _checked_spec(model: str, task: str):
    """Default spec of ``model``; a clear error when it is not a ``task`` model."""
    info = model_info(model)
    if info.task != task:
        other = "det" if task == "classification" else "cls"
        raise InvalidInput(f"{model} is a {info.task} model; use `irpe train {other}`")
    return default_spec(model)


class ClassificationTask:
    """ImageFolder (DIR/train, DIR/val) or the synthetic shapes set; DeiT loss with mixup."""

    main_metric = "top1"
    train_set: Union[ShapesClassification, ImageFolder]
    val_set: Union[ShapesClassification, ImageFolder]

    def __init__(self, cfg: "TrainConfig", dist: Dist = SINGLE) -> None:
        from ..data.datasets import ImageFolder, ShapesClassification, check_same_classes
        preprocess = _checked_spec(cfg.model, "classification").transform()
        if cfg.data == SHAPES:
            size = preprocess.size
            self.train_set = ShapesClassification(cfg.shapes_train, cfg.seed, size, preprocess)
            self.val_set = ShapesClassification(cfg.shapes_val, cfg.seed, size, preprocess,
                                                split="val")
        else:
            train_set = ImageFolder(os.path.join(cfg.data, "train"), preprocess)
            val_set = ImageFolder(os.path.join(cfg.data, "val"), preprocess)
            check_same_classes(val_set.classes, train_set.classes,
                               f"class folders of {val_set.root}", "training classes")
            self.train_set, self.val_set = train_set, val_set
        classes = list(self.train_set.classes)
        overrides: Dict[str, Any] = {"num_classes": len(classes), "drop_path_rate": cfg.drop_path}
        self.model = create_model(cfg.model, **overrides)
        self.spec = default_spec(cfg.model, classes, num_classes=len(classes))
        self.cfg, self.dist, self.gen = cfg, dist, torch.Generator().manual_seed(cfg.seed + 1)
        self.coins = StepCoins(self.gen, 0.5 if cfg.hflip else 0.0, dist, cfg.grad_accum_steps)

    def loaders(self) -> Tuple[DataLoader, DataLoader]:
        return _loaders(self, {})

    def begin_step(self, micro: List) -> None:
        """Before the step's first micro-batch: the global batch's flip coins."""
        self.coins.draw(len(micro[0][0]))

    def loss(self, model: nn.Module, batch: Tuple[torch.Tensor, torch.Tensor], device: str,
             micro: int = 0) -> Tuple[torch.Tensor, Dict]:
        images, labels = batch
        images = random_hflip(images, None, self.coins.flips(micro))
        images, labels = images.to(device), labels.to(device)
        images, targets = mixup_cutmix(images, labels, len(self.spec.class_names),
                                       self.cfg.mixup, self.cfg.cutmix, self.cfg.label_smoothing)
        logits = model(images)
        if isinstance(logits, tuple):  # distilled model in train mode: both heads, same target
            loss = cast(torch.Tensor, sum(soft_cross_entropy(lg, targets) for lg in logits)
                        ) / len(logits)
        else:
            loss = soft_cross_entropy(logits, targets)
        return loss, {}

    def evaluate(self, model: nn.Module, loader: DataLoader, device: str) -> Dict:
        return evaluate_classification(model, loader, device, self.dist)


class DetectionTask:
    """COCO-format directory (DIR/annotations/instances_{train,val}.json) or synthetic shapes."""

    main_metric = "AP50"
    train_set: Union[ShapesDetection, CocoDetection]
    val_set: Union[ShapesDetection, CocoDetection]

    def __init__(self, cfg: "TrainConfig", dist: Dist = SINGLE) -> None:
        from ..data.datasets import CocoDetection, ShapesDetection, check_same_classes
        preprocess = _checked_spec(cfg.model, "detection").transform()
        if cfg.data == SHAPES:
            self.train_set = ShapesDetection(cfg.shapes_train, cfg.seed, transform=preprocess)
            self.val_set = ShapesDetection(cfg.shapes_val, cfg.seed, transform=preprocess,
                                           split="val")
        else:
            self.train_set = CocoDetection(cfg.data, "train", preprocess)
            self.val_set = CocoDetection(cfg.data, "val", preprocess)
            check_same_classes(self.val_set.categories, self.train_set.categories,
                               "categories of instances_val.json", "training categories")
        classes = list(self.train_set.categories)
        # from scratch the ResNet needs trainable BatchNorm; in eval it equals the frozen one
        norm = "frozen" if cfg.init else "batch"
        self.model = create_model(cfg.model, num_classes=len(classes), norm=norm)
        self.spec = default_spec(cfg.model, classes, num_classes=len(classes))
        self.criterion = SetCriterion(len(classes), HungarianMatcher(), dist=dist)
        self.cfg, self.dist, self.gen = cfg, dist, torch.Generator().manual_seed(cfg.seed + 1)
        self.coins = StepCoins(self.gen, 0.5 if cfg.hflip else 0.0, dist, cfg.grad_accum_steps)
        self.totals: Optional[StepTotals] = None

    def loaders(self) -> Tuple[DataLoader, DataLoader]:
        from ..data.datasets import collate_detection
        return _loaders(self, {"collate_fn": collate_detection})

    def begin_step(self, micro: List) -> None:
        """Before the step's first micro-batch: flip coins, and the box counts of the whole
        step that the set loss divides by (known before any micro-batch runs)."""
        self.coins.draw(len(micro[0][0]))
        queries = cast(int, self.model.num_queries)  # DETR's int (nn.Module types attributes)
        self.totals = self.criterion.step_totals(
            [StepTotals.local(targets, queries) for _, _, targets in micro])

    def loss(self, model: nn.Module, batch: Tuple[torch.Tensor, torch.Tensor, List[Dict]],
             device: str, micro: int = 0) -> Tuple[torch.Tensor, Dict]:
        images, sizes, targets = batch
        flip = self.coins.flips(micro)
        images = random_hflip(images, sizes, flip)
        targets = [_flip_target(t, bool(f), device) for t, f in zip(targets, flip, strict=True)]
        outputs = model(images.to(device), sizes.to(device))
        self.criterion.to(device)
        losses = self.criterion(outputs, targets, self.totals)
        parts = ("loss_ce", "loss_bbox", "loss_giou")
        return losses["loss"], {k: float(losses[k].detach()) for k in parts}

    def evaluate(self, model: nn.Module, loader: DataLoader, device: str) -> Dict:
        return evaluate_detection(model, self.val_set, self.cfg.batch_size, device,
                                  dist=self.dist)


def _loaders(task: Any, kw: Dict) -> Tuple[DataLoader, DataLoader]:
    """Train loader over this rank's share of a seed + epoch shuffle, val over its shard.

    The loaders get private generators (worker seeds only), so iterating them never draws
    from the global RNG that drop-path and mixup use: resuming replays the same stream.
    """
    cfg, dist = task.cfg, task.dist
    kw = dict(kw, batch_size=cfg.batch_size, num_workers=cfg.workers)
    sampler = ResumableSampler(len(task.train_set), dist, cfg.seed, cfg.batch_size,
                               cfg.grad_accum_steps)
    train = DataLoader(task.train_set, drop_last=True, sampler=sampler,
                       generator=torch.Generator().manual_seed(cfg.seed + 2), **kw)
    val = DataLoader(task.val_set, sampler=ShardSampler(len(task.val_set), dist),
                     generator=torch.Generator().manual_seed(cfg.seed + 3), **kw)
    return train, val


def _flip_target(target: Dict, flip: bool, device: str) -> Dict:
    """Move a target to ``device``; mirror its normalised cx when the image was flipped."""
    target = {k: v.to(device) if torch.is_tensor(v) else v for k, v in target.items()}
    if flip:
        boxes = target["boxes"].clone()
        boxes[:, 0] = 1.0 - boxes[:, 0]
        target["boxes"] = boxes
    return target


Task = Union[ClassificationTask, DetectionTask]
TASKS: Dict[str, Union[Type[ClassificationTask], Type[DetectionTask]]] = dict(
    zip(TASK_NAMES, (ClassificationTask, DetectionTask), strict=True))
