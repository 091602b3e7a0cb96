"""The training loop shared by classification and detection (DeiT / DETR recipes).

Every epoch: train with AdamW + warmup-cosine (+ grad clipping, AMP on CUDA), write ``last.pt``
(resume state), evaluate on the validation split, append a JSON line to ``log.jsonl`` and,
when the main metric of a completed epoch improves, write ``model.safetensors`` (weights +
ModelSpec metadata). The best is chosen over completed epochs only: a run stopped mid-epoch
(``--max-steps``) and resumed then writes the same bytes as the run straight through.
Under torchrun every process trains its share of each global batch (DDP); rank 0 writes.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from typing import (
    TYPE_CHECKING,
    ContextManager,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Tuple,
    cast,
)

import torch

from ..artifact.trained import save_trained
from ..checkpoint import CheckpointError
from ..errors import InvalidInput
from .config import CONFIG_FIELDS, TrainConfig, recipe
from .distributed import ResumableSampler, batches, setup, teardown
from .optim import param_groups, warmup_cosine
from .state import (
    canonical_tree,
    check_fits,
    logged,
    read_last,
    restore_rng,
    resume_step,
    rng_snapshot,
)
from .tasks import TASKS, Batch

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["TrainConfig", "CONFIG_FIELDS", "train"]  # TrainConfig: irpe.training.config


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
    """Holds model, optimiser, schedule and loaders of one run (one process of a DDP job)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.dist, self.device = setup(cfg.device, cfg.dist_timeout)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg, self.main = cfg, self.dist.main
        self.task = TASKS[cfg.task](cfg, self.dist)
        self.model = self._prepare(self.task.model)
        self.net = self._wrap(self.model)
        torch.manual_seed(cfg.seed + self.dist.rank)  # per-rank streams: drop-path, mixup
        self.train_loader, self.val_loader = self.task.loaders()
        self.accum = cfg.grad_accum_steps
        self.steps_per_epoch = len(self.train_loader) // self.accum
        self.global_batch = cfg.batch_size * self.dist.world * self.accum
        if self.steps_per_epoch == 0:
            raise InvalidInput(f"training set has fewer images than one global batch "
                               f"({self.global_batch} = {self.split})")
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
        self.epoch, self.step, self.epoch_step, self.best = 0, 0, 0, -math.inf
        self.pending_eval = False  # a resumed completed epoch not evaluated yet (load_state)
        if self.main:
            os.makedirs(cfg.output, exist_ok=True)
        if cfg.resume:
            self.load_state(cfg.resume)
        self._say_setup()

    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Initial weights, and SyncBatchNorm for multi-GPU runs that train BatchNorm."""
        if self.cfg.init:
            n = _init_weights(model, self.cfg.init)
            if self.main:
                print(f"init: {n} tensors from {self.cfg.init}")
        if self.dist.world > 1 and self.device.startswith("cuda") and not self.cfg.freeze_bn:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return model.to(self.device)

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.dist.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel
        ids = [self.dist.local_rank] if self.device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)

    @property
    def split(self) -> str:
        """How the global batch is made: "8 (batch size) x 1 (processes) x 2 (accumulated)"."""
        return (f"{self.cfg.batch_size} (--batch-size) x {self.dist.world} (processes) x "
                f"{self.accum} (--grad-accum-steps)")

    @property
    def finished(self) -> bool:
        """Whether the run (resumed) has already completed all of ``--epochs``."""
        return self.epoch >= self.cfg.epochs

    def _say_setup(self) -> None:
        d = self.dist
        if not self.main:
            return
        if d.world == 1:
            if self.accum > 1:
                print(f"global batch {self.global_batch} = {self.cfg.batch_size} x "
                      f"{self.accum} accumulated micro-batches", flush=True)
            return
        accum = f" x {self.accum} accumulated" if self.accum > 1 else ""
        print(f"distributed: {d.world} processes ({d.backend}), global batch "
              f"{self.global_batch} = {self.cfg.batch_size} per process x {d.world}{accum}; "
              f"lr {self.cfg.lr:g} is the lr of the global batch (not rescaled)", flush=True)
        if self.device == "cpu" and not self.cfg.freeze_bn and _has_batchnorm(self.model):
            print("note: BatchNorm statistics are per process on CPU (SyncBatchNorm needs "
                  "CUDA); --freeze-bn keeps them fixed", flush=True)

    def state(self, rng: Optional[Dict]) -> Dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "epoch": self.epoch, "step": self.step, "epoch_step": self.epoch_step,
                "global_batch": self.global_batch, "processes": self.dist.world,
                "best": self.best, "rng": rng, "classes": list(self.task.spec.class_names),
                "config": recipe(self.cfg)}

    def load_state(self, path: str) -> None:
        """Continue an interrupted run from its ``last.pt`` (any number of processes)."""
        state = read_last(path, self.cfg.model, list(self.task.spec.class_names))
        check_fits(self.model, state, path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.step, self.best = state["epoch"], state["step"], state["best"]
        self.epoch_step = resume_step(state, self.global_batch, path)
        self.pending_eval = self._unevaluated()
        note = restore_rng(state.get("rng"), self.dist, self.task.gen, self.cfg.seed, self.epoch)
        if state.get("global_batch", self.global_batch) != self.global_batch:
            note += (f"{'; ' if note else ''}global batch was {state['global_batch']}, now "
                     f"{self.global_batch} = {self.split}: the lr schedule goes on in steps "
                     "of the new batch")
        if note and self.main:
            print(f"resume: {note}", flush=True)

    def train_epoch(self) -> Dict[str, float]:
        """Train to the end of the epoch (or max_steps); advances epoch/epoch_step."""
        from tqdm import tqdm
        self.net.train()
        if self.cfg.freeze_bn:
            for m in self.model.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.eval()
        sampler = cast(ResumableSampler, self.train_loader.sampler)  # as tasks._loaders made it
        sampler.set_epoch(self.epoch, self.epoch_step * self.cfg.batch_size * self.accum)
        bar = tqdm(_steps(self.train_loader, self.accum),
                   total=self.steps_per_epoch - self.epoch_step,
                   desc=f"epoch {self.epoch + 1}/{self.cfg.epochs}",
                   disable=not (self.cfg.progress and self.main), leave=False,
                   dynamic_ncols=True)
        count: float  # steps; the sum over ranks below comes back as a float
        total, count = 0.0, 0
        for micro in bar:
            loss, parts = self.train_step(micro)
            total, count, self.epoch_step = total + loss, count + 1, self.epoch_step + 1
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{self.optimizer.param_groups[0]['lr']:.2e}")
            if self._stop():
                break
        if self.epoch_step >= self.steps_per_epoch:
            self.epoch, self.epoch_step = self.epoch + 1, 0
        total, count = self.dist.all_sum([total, count])
        return {"train_loss": total / max(count, 1), "steps": int(count / self.dist.world)}

    def _stop(self) -> bool:
        return bool(self.cfg.max_steps) and self.step >= self.cfg.max_steps

    def train_step(self, micro: List[Batch]) -> Tuple[float, Dict[str, float]]:
        """One optimiser step over this process's micro-batches of a global batch.

        Each micro-batch's loss is scaled by 1 / grad_accum_steps and its gradient added up;
        under DDP only the last backward all-reduces (the others run in ``no_sync``), which
        scales by 1 / processes. Both scales are powers of two for the usual splits, so the
        summed gradient is the same floats whether the slots are processes or micro-batches.
        """
        self.optimizer.zero_grad(set_to_none=True)
        self.task.begin_step(micro)
        losses: List[float] = []
        parts_sum: Dict[str, float] = {}
        for k, batch in enumerate(micro):
            with self._sync(k == len(micro) - 1):
                with torch.autocast(self.device.split(":")[0], dtype=self.amp_dtype,
                                    enabled=self.amp):
                    loss, parts = self.task.loss(self.net, batch, self.device, k)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {float(loss)} at step {self.step}; "
                                             "lower the lr")
                scaled = loss / len(micro) if len(micro) > 1 else loss
                self.scaler.scale(scaled).backward()
            losses.append(float(loss.detach()))
            for name, value in parts.items():
                parts_sum[name] = parts_sum.get(name, 0.0) + value / len(micro)
        if self.cfg.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.step += 1
        return sum(losses) / len(losses), parts_sum

    def _sync(self, last: bool) -> ContextManager:
        """DDP all-reduces on the last micro-batch of a step only."""
        if last or self.dist.world == 1:
            return contextlib.nullcontext()
        return cast("DistributedDataParallel", self.net).no_sync()  # _wrap: DDP when world > 1

    def run(self) -> Dict:
        """Train the remaining epochs; returns the last log record (with the best metric).
        A resumed run that already completed ``--epochs`` trains and writes nothing: its record
        says ``finished`` (the CLI says so in one line)."""
        record: Dict = {}
        start = time.perf_counter()
        if self.pending_eval:  # stopped after last.pt, before the epoch's evaluation ended
            record = self.evaluate({}, rng_snapshot(self.dist, self.task.gen), start)
        elif self.finished:
            return {"finished": True, "epoch": self.epoch, "epochs": self.cfg.epochs,
                    "step": self.step, "best": self.best, "train_seconds": 0.0}
        while self.epoch < self.cfg.epochs:
            t0 = time.perf_counter()
            record = self.train_epoch()
            rng = rng_snapshot(self.dist, self.task.gen)  # before eval: nothing else drawn
            self.write_last(rng)  # an evaluation error never loses the epoch's training
            record = self.evaluate(record, rng, t0)
            if self._stop():
                break
        record["train_seconds"] = time.perf_counter() - start
        record["best"] = self.best
        return record

    def evaluate(self, record: Dict, rng: Optional[Dict], t0: float) -> Dict:
        """Evaluate the weights as they stand, complete the epoch's record and save it."""
        with self._no_draws():
            metrics = self.task.evaluate(self.model, self.val_loader, self.device)
        record.update({f"val_{k}": v for k, v in metrics.items()})
        record.update(epoch=self.epoch + (1 if self.epoch_step else 0), step=self.step,
                      global_batch=self.global_batch, processes=self.dist.world,
                      seconds=time.perf_counter() - t0)
        if self.epoch_step:
            record["partial"] = True
        self.save(record, metrics[self.task.main_metric], rng)
        return record

    def _unevaluated(self) -> bool:
        """Whether the resumed state is a completed epoch whose evaluation did not reach its
        log line (a Ctrl-C or an error between last.pt and the end of the evaluation): the
        resumed run evaluates it first, as the run straight through did, so a best epoch is
        never skipped. Rank 0 reads the log; every rank follows its answer."""
        mine = 0.0
        if self.main and self.epoch and not self.epoch_step:
            mine = 0.0 if logged(self.cfg.output, self.epoch, self.step) else 1.0
        return self.dist.all_sum([mine])[0] > 0

    def _no_draws(self) -> ContextManager:
        """Evaluation leaves the torch RNG streams as it found them: a DataLoader made to
        evaluate draws its seed from the global stream, which a run that stops at the epoch's
        end and is resumed (from the state saved before evaluating) would not see."""
        devices = [torch.device(self.device).index or 0] if self.device.startswith("cuda") \
            else []
        return torch.random.fork_rng(devices=devices)

    def save(self, record: Dict, metric: float, rng: Optional[Dict]) -> None:
        """Rank 0: log line; when a completed epoch improves the best (a tie keeps the earlier
        one), model.safetensors and last.pt (its new best: otherwise the last.pt run() wrote
        before evaluating is already this state).

        A partial epoch (``--max-steps``) is evaluated and logged but never the best: resumed,
        it completes, and the file is then what the run straight through writes. Before any
        epoch has completed, the partial epoch's weights are written as a provisional model
        (metadata ``irpe.train.partial``) so a short run still leaves one; the first completed
        epoch always replaces it."""
        partial = bool(record.get("partial"))
        improved = not partial and (metric > self.best or self.best == -math.inf)
        provisional = partial and self.best == -math.inf
        if improved:
            self.best = metric
        if not self.main:
            return
        if improved or provisional:  # first: a logged epoch has its files (_unevaluated)
            self._write_model(record, metric, rng, improved)
        with open(os.path.join(self.cfg.output, "log.jsonl"), "a") as fh:
            fh.write(json.dumps(record) + "\n")
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in record.items()), flush=True)

    def _write_model(self, record: Dict, metric: float, rng: Optional[Dict],
                     best: bool) -> None:
        """model.safetensors, and for a new best its last.pt, with Ctrl-C held across both
        (irpe.atomic.held_interrupts): a Ctrl-C lands before or after the pair, so last.pt's
        best always describes the model.safetensors beside it."""
        from irpe.atomic import held_interrupts
        with held_interrupts():
            extra = {"irpe.train.epoch": str(record["epoch"]),
                     f"irpe.train.val_{self.task.main_metric}": f"{metric:.4f}",
                     "irpe.train.config": json.dumps(recipe(self.cfg))}
            if not best:
                extra["irpe.train.partial"] = (f"{self.epoch_step} of {self.steps_per_epoch} "
                                               "steps")
            save_trained(self.model, os.path.join(self.cfg.output, "model.safetensors"),
                         self.task.spec, extra)
            if best:
                self.write_last(rng)

    def write_last(self, rng: Optional[Dict]) -> None:
        """Rank 0 replaces ``last.pt`` atomically; equal states give equal bytes: saved through
        a file object (torch.save names the archive inside after a path it is given, here the
        temporary's, with a pid) and as a canonical tree (:func:`.state.canonical_tree`)."""
        if not self.main:
            return
        from irpe.atomic import atomic_open
        with atomic_open(os.path.join(self.cfg.output, "last.pt"), "wb") as fh:
            torch.save(canonical_tree(self.state(rng)), fh)


def _steps(loader: Iterable, accum: int) -> Iterator[List]:
    """The loader's micro-batches in lists of ``accum`` (one optimiser step each)."""
    micro: List = []
    for batch in batches(loader):
        micro.append(batch)
        if len(micro) == accum:
            yield micro
            micro = []


def _has_batchnorm(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def train(cfg: TrainConfig) -> Dict:
    """Run a training job end to end; returns the final record (metrics, time, best)."""
    trainer = Trainer(cfg)
    try:
        record = trainer.run()
    except BaseException:
        teardown(trainer.dist, meet=False)
        raise
    teardown(trainer.dist)
    return record

