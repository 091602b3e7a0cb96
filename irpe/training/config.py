"""The settings of one training run: :class:`TrainConfig` (saved in ``last.pt`` and the log).

Its own module, below the tasks and the trainer that both read it (no import cycle).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Optional

from ..errors import InvalidInput

__all__ = ["TASK_NAMES", "TrainConfig", "CONFIG_FIELDS", "RUN_CONTROL", "recipe"]

TASK_NAMES = ("classification", "detection")  # the keys of irpe.training.tasks.TASKS


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
    freeze_bn: bool = False       # BatchNorm layers keep their running statistics (eval mode)
    dist_timeout: float = 600.0   # seconds a collective may wait for a peer (torchrun runs)
    grad_accum_steps: int = 1     # micro-batches of batch_size summed into one optimiser step

    def __post_init__(self) -> None:
        if self.task not in TASK_NAMES:
            raise InvalidInput(f"task must be one of {sorted(TASK_NAMES)}, got {self.task!r}")
        for name in ("epochs", "batch_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name} must be >= 1")
        if self.dist_timeout <= 0:
            raise InvalidInput("dist_timeout must be > 0")
        if self.lr <= 0 or self.min_lr < 0 or self.weight_decay < 0:
            raise InvalidInput("lr must be > 0, min_lr and weight_decay >= 0")


CONFIG_FIELDS = {f.name for f in fields(TrainConfig)}
# how a run is driven, not what it computes: where it writes, where it stops (--max-steps), what
# it resumed from, threads, progress; left out of the files a run writes, so a run interrupted
# and resumed writes the same bytes as the run straight through (docs/training.md)
RUN_CONTROL = ("output", "resume", "max_steps", "progress", "threads", "workers",
               "dist_timeout")


def recipe(cfg: TrainConfig) -> Dict[str, Any]:
    """The settings that decide the weights (all but :data:`RUN_CONTROL`), as saved in
    ``last.pt`` and in ``model.safetensors``' metadata."""
    return {k: v for k, v in asdict(cfg).items() if k not in RUN_CONTROL}
