"""Parameter and MAC counts without allocating weights (meta device + FlopCounterMode)."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_params", "count_macs", "default_input_size", "profile_model"]


def count_params(model: nn.Module) -> int:
    """Number of parameters (shared tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def count_macs(model: nn.Module, input_shape: Tuple[int, ...]) -> int:
    """Multiply-accumulates of one forward (matmul/conv/linear; gathers count as zero)."""
    device = next(model.parameters()).device
    x = torch.empty(input_shape, device=device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() // 2


def default_input_size(name: str) -> Tuple[int, int]:
    """Input (H, W) a model is profiled at, from its own eval preprocessing: a classifier's crop
    size; a detector's ``min_size`` short side by a long side of 1.52 x that (COCO's mean
    aspect, a multiple of 32) capped at ``max_size`` (800x1216 with DETR's 800/1333)."""
    from .models import model_info
    info = model_info(name)
    if info.family == "detr":
        short = int(info.preprocess.get("min_size", 800))
        long = min(int(info.preprocess.get("max_size", 1333)), round(short * 1.52 / 32) * 32)
        return (short, max(short, long))
    size = int(info.preprocess.get("size", info.config.get("img_size", 224)))
    return (size, size)


def profile_model(name: str) -> Tuple[int, int]:
    """(params, MACs) of a registered model at batch 1 and its default input size (meta device)."""
    from .models import create_model
    with torch.device("meta"):
        model = create_model(name).eval().requires_grad_(False)
    return count_params(model), count_macs(model, (1, 3) + default_input_size(name))
