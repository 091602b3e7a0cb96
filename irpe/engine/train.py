"""The training loop shared by classification and detection (DeiT / DETR recipes).

Every epoch: train with AdamW + warmup-cosine (+ grad clipping, AMP on CUDA), evaluate on the
validation split, append a JSON line to ``log.jsonl``, write ``last.pt`` (resume state) and,
when the main metric improves, ``model.safetensors`` (weights + ModelSpec metadata).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from typing import Dict, Optional

import torch

from ..artifact import save_trained
from ..checkpoint import CheckpointError
from .optim import param_groups, warmup_cosine
from .tasks import TASKS

__all__ = ["TrainConfig", "train"]


@dataclass
class TrainConfig:
    """All settings of one run (saved in ``last.pt`` and the log)."""

    task: str
    model: str
    data: str
    output: str
    epochs: int = 30
    batch_size: int = 64
    lr: float = 5e-4
    min_lr: float = 1e-5
    lr_backbone: float = 0.0      # detection: backbone lr (0 = same as lr)
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    drop_path: float = 0.1
    clip_grad: float = 0.0        # max grad norm, 0 = off
    hflip: bool = True
    init: Optional[str] = None    # weights to start from (matching shapes only)
    resume: Optional[str] = None  # last.pt of an interrupted run
    device: str = "auto"
    amp: bool = True              # bf16/fp16 autocast on CUDA only
    seed: int = 0
    threads: int = 0
    workers: int = 0
    max_steps: int = 0            # stop after this many steps (smoke tests), 0 = all
    shapes_train: int = 4000
    shapes_val: int = 1000
    progress: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {self.task!r}")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.lr <= 0 or self.min_lr < 0 or self.weight_decay < 0:
            raise ValueError("lr must be > 0, min_lr and weight_decay >= 0")


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    return name


def _init_weights(model: torch.nn.Module, path: str) -> int:
    """Copy tensors of matching name and shape from a checkpoint; returns how many."""
    from ..checkpoint import read_state_dict
    state, own = read_state_dict(path), model.state_dict()
    keep = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if not keep:
        raise CheckpointError(f"no tensor of {path} fits {type(model).__name__}")
    model.load_state_dict(keep, strict=False)
    return len(keep)


class Trainer:
    """Holds model, optimiser, schedule and loaders of one run."""

    def __init__(self, cfg: TrainConfig) -> None:
        torch.manual_seed(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg, self.device = cfg, _device(cfg.device)
        self.task = TASKS[cfg.task](cfg)
        self.model = self.task.model.to(self.device)
        if cfg.init:
            print(f"init: {_init_weights(self.model, cfg.init)} tensors from {cfg.init}")
        self.train_loader, self.val_loader = self.task.loaders()
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise ValueError(f"training set has fewer images than one batch ({cfg.batch_size})")
        total = cfg.epochs * self.steps_per_epoch
        warmup = int(cfg.warmup_epochs * self.steps_per_epoch)
        groups = param_groups(self.model, cfg.weight_decay, cfg.lr, cfg.lr_backbone or None)
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: warmup_cosine(s, total, warmup, cfg.min_lr / cfg.lr))
        self.amp = cfg.amp and self.device.startswith("cuda")
        self.amp_dtype = torch.bfloat16 if self.amp and torch.cuda.is_bf16_supported() \
            else torch.float16
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)
        self.epoch, self.step, self.best = 0, 0, -math.inf
        os.makedirs(cfg.output, exist_ok=True)
        if cfg.resume:
            self.load_state(cfg.resume)

    def state(self) -> Dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "epoch": self.epoch, "step": self.step, "best": self.best,
                "config": asdict(self.cfg)}

    def load_state(self, path: str) -> None:
        """Continue an interrupted run from its ``last.pt``."""
        if not os.path.isfile(path):
            raise CheckpointError(f"resume file not found: {path}")
        state = torch.load(path, map_location=self.device, weights_only=True)
        if state.get("config", {}).get("model") != self.cfg.model:
            raise CheckpointError(f"{path} was trained as {state.get('config', {}).get('model')}"
                                  f", not {self.cfg.model}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.step, self.best = state["epoch"], state["step"], state["best"]

    def train_epoch(self) -> Dict[str, float]:
        from tqdm import tqdm
        self.model.train()
        bar = tqdm(self.train_loader, desc=f"epoch {self.epoch + 1}/{self.cfg.epochs}",
                   disable=not self.cfg.progress, leave=False, dynamic_ncols=True)
        total, count = 0.0, 0
        for batch in bar:
            loss, parts = self.train_step(batch)
            total, count = total + loss, count + 1
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{self.optimizer.param_groups[0]['lr']:.2e}")
            if self.cfg.max_steps and self.step >= self.cfg.max_steps:
                break
        return {"train_loss": total / max(count, 1), "steps": count}

    def train_step(self, batch):
        with torch.autocast(self.device.split(":")[0], dtype=self.amp_dtype, enabled=self.amp):
            loss, parts = self.task.loss(self.model, batch, self.device)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {float(loss)} at step {self.step}; lower the lr")
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.cfg.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.step += 1
        return float(loss.detach()), parts

    def run(self) -> Dict:
        """Train the remaining epochs; returns the last log record (with the best metric)."""
        record, start = {}, time.perf_counter()
        while self.epoch < self.cfg.epochs:
            t0 = time.perf_counter()
            record = self.train_epoch()
            metrics = self.task.evaluate(self.model, self.val_loader, self.device)
            self.epoch += 1
            record.update({f"val_{k}": v for k, v in metrics.items()})
            record.update(epoch=self.epoch, step=self.step, seconds=time.perf_counter() - t0)
            self.save(record, metrics[self.task.main_metric])
            if self.cfg.max_steps and self.step >= self.cfg.max_steps:
                break
        record["train_seconds"] = time.perf_counter() - start
        record["best"] = self.best
        return record

    def save(self, record: Dict, metric: float) -> None:
        with open(os.path.join(self.cfg.output, "log.jsonl"), "a") as fh:
            fh.write(json.dumps(record) + "\n")
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in record.items()), flush=True)
        if metric > self.best:
            self.best = metric
            extra = {"irpe.train.epoch": str(self.epoch),
                     f"irpe.train.val_{self.task.main_metric}": f"{metric:.4f}",
                     "irpe.train.config": json.dumps(asdict(self.cfg))}
            save_trained(self.model, os.path.join(self.cfg.output, "model.safetensors"),
                         self.task.spec, extra)
        tmp = os.path.join(self.cfg.output, "last.pt.tmp")
        torch.save(self.state(), tmp)
        os.replace(tmp, os.path.join(self.cfg.output, "last.pt"))


def train(cfg: TrainConfig) -> Dict:
    """Run a training job end to end; returns the final record (metrics, time, best)."""
    return Trainer(cfg).run()


CONFIG_FIELDS = {f.name for f in fields(TrainConfig)}
