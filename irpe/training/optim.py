# Follows the code of facebookresearch/deit (Apache-2.0) and timm (Apache-2.0): see NOTICE.
"""Optimiser pieces of the DeiT recipe: AdamW groups, warmup + cosine, mixup/cutmix targets."""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["param_groups", "warmup_cosine", "mixup_cutmix", "soft_cross_entropy"]


def _no_decay(name: str, param: torch.Tensor, skip: set) -> bool:
    # biases, norms, tokens, position embeddings and iRPE lookup tables (paper supp.) get no decay
    return param.ndim <= 1 or name in skip or "lookup_table" in name or name.endswith(".bias")


def param_groups(model: nn.Module, weight_decay: float, lr: float,
                 lr_backbone: Optional[float] = None) -> List[Dict]:
    """AdamW parameter groups: decay vs no decay, and DETR's backbone at its own lr."""
    no_weight_decay = getattr(model, "no_weight_decay", None)  # timm's hook, where defined
    skip = set(no_weight_decay()) if no_weight_decay is not None else set()
    groups: Dict[Tuple[bool, bool], Dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        backbone = lr_backbone is not None and name.startswith("backbone.")
        nodecay = _no_decay(name, param, skip)
        group = groups.setdefault((backbone, nodecay), {
            "params": [], "names": [], "weight_decay": 0.0 if nodecay else weight_decay,
            "lr": lr_backbone if backbone else lr})
        group["params"].append(param)
        group["names"].append(name)
    return list(groups.values())


def warmup_cosine(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """LR multiplier: linear warmup to 1 over ``warmup`` steps, cosine down to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def smooth_one_hot(labels: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """Label-smoothed one-hot targets (timm convention: off = smoothing / classes)."""
    off = smoothing / num_classes
    return torch.full((labels.numel(), num_classes), off, device=labels.device).scatter_(
        1, labels.view(-1, 1), 1.0 - smoothing + off)


def mixup_cutmix(images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                 mixup: float, cutmix: float, smoothing: float,
                 generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mix the batch with its reverse (mixup, or cutmix when chosen); returns soft targets."""
    targets = smooth_one_hot(labels, num_classes, smoothing)
    use_cutmix = cutmix > 0 and (mixup <= 0 or torch.rand((), generator=generator) < 0.5)
    alpha = cutmix if use_cutmix else mixup
    if alpha <= 0:
        return images, targets
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    if use_cutmix:
        images, lam = _cutmix(images, lam, generator)
    else:
        images = images * lam + images.flip(0) * (1 - lam)
    return images, targets * lam + targets.flip(0) * (1 - lam)


def _cutmix(images: torch.Tensor, lam: float,
            generator: Optional[torch.Generator]) -> Tuple[torch.Tensor, float]:
    h, w = images.shape[-2:]
    cut_h, cut_w = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
    cy = int(torch.randint(h, (), generator=generator))
    cx = int(torch.randint(w, (), generator=generator))
    y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
    x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
    images = images.clone()
    images[..., y0:y1, x0:x1] = images.flip(0)[..., y0:y1, x0:x1]
    return images, 1 - (y1 - y0) * (x1 - x0) / (h * w)  # lam from the box actually pasted


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy against soft (mixed / smoothed) target distributions."""
    return torch.sum(-targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
