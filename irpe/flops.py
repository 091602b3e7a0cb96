"""Parameter and MAC counts without allocating weights (meta device + FlopCounterMode)."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_params", "count_macs", "profile_model"]


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


def profile_model(name: str, img_size: int = 224) -> Tuple[int, int]:
    """(params, MACs) of a registered model at batch 1, built on the meta device."""
    from .models import create_model
    with torch.device("meta"):
        model = create_model(name).eval()
    return count_params(model), count_macs(model, (1, 3, img_size, img_size))
