# Follows the code of facebookresearch/detr (Apache-2.0) and torchvision
# (BSD-3-Clause): see NOTICE.
"""ResNet backbones for DETR with torchvision-compatible keys and frozen BatchNorm.

Padding-exact: every conv input is zeroed outside each image's valid region (sizes tracked with
the conv output formula), so an image in a padded batch gets exactly the features it gets alone.
Keys under ``body.`` equal torchvision's resnet (minus ``fc``); DETR nests it as backbone.0.body.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

__all__ = ["FrozenBatchNorm2d", "ResNetBody", "Backbone", "conv_out_size"]

Sizes = torch.Tensor  # (B, 2) int64: valid (height, width) per image


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm with fixed statistics and affine (buffers: weight, bias, running_mean/var)."""

    weight: torch.Tensor
    bias: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        for name, fill in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0),
                           ("running_var", 1.0)):
            self.register_buffer(name, torch.full((num_features,), fill))

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, *args,
                              **kwargs) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)  # torchvision checkpoints carry it
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)


def conv_out_size(sizes: Sizes, kernel: int, stride: int, padding: int) -> Sizes:
    """Valid output sizes of a conv/pool for valid input sizes (floor formula)."""
    return torch.div(sizes + 2 * padding - kernel, stride, rounding_mode="floor") + 1


def valid_mask(sizes: Sizes, height: int, width: int) -> torch.Tensor:
    """(B, H, W) bool, True inside each image's valid top-left region."""
    rows = torch.arange(height, device=sizes.device).view(1, -1, 1)
    cols = torch.arange(width, device=sizes.device).view(1, 1, -1)
    return (rows < sizes[:, 0].view(-1, 1, 1)) & (cols < sizes[:, 1].view(-1, 1, 1))


def masked(layer: nn.Module, x: torch.Tensor, sizes: Optional[Sizes]
           ) -> Tuple[torch.Tensor, Optional[Sizes]]:
    """Apply a Conv2d/MaxPool2d after zeroing the padded region; returns output, valid sizes."""
    if sizes is None:
        return layer(x), None
    x = x * valid_mask(sizes, x.shape[-2], x.shape[-1]).unsqueeze(1).to(x.dtype)
    k, s, p = (_first(getattr(layer, a)) for a in ("kernel_size", "stride", "padding"))
    return layer(x), conv_out_size(sizes, k, s, p)


def _first(v: Union[int, Sequence[int]]) -> int:
    return v if isinstance(v, int) else v[0]


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, width, 3, stride), FrozenBatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3), FrozenBatchNorm2d(width)
        self.downsample = _downsample(cin, width, stride)
        self.convs = ["conv1", "conv2"]


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, width, 1), FrozenBatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride), FrozenBatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, width * 4, 1), FrozenBatchNorm2d(width * 4)
        self.downsample = _downsample(cin, width * 4, stride)
        self.convs = ["conv1", "conv2", "conv3"]


def _downsample(cin: int, cout: int, stride: int) -> Optional[nn.Sequential]:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                         FrozenBatchNorm2d(cout))


def block_forward(block: Union[BasicBlock, Bottleneck], x: torch.Tensor, sizes: Optional[Sizes]
                  ) -> Tuple[torch.Tensor, Optional[Sizes]]:
    """Residual block with masked convs: relu(bn(conv(...)) + shortcut)."""
    out, out_sizes = x, sizes
    for i, name in enumerate(block.convs):
        out, out_sizes = masked(getattr(block, name), out, out_sizes)
        out = getattr(block, f"bn{i + 1}")(out)
        if i < len(block.convs) - 1:
            out = out.relu()
    shortcut = x
    if block.downsample is not None:
        shortcut, _ = masked(block.downsample[0], x, sizes)
        shortcut = block.downsample[1](shortcut)
    return (out + shortcut).relu(), out_sizes


class ResNetBody(nn.Module):
    """torchvision ResNet stem + layer1..N (no fc); returns the last stage's features and sizes.

    ``len(widths)`` stages are built (4: stride 32 as torchvision; 3: stride 16 for small
    inputs). ``norm="batch"`` uses trainable BatchNorm2d (training from scratch; same keys).
    """

    def __init__(self, block: str = "bottleneck", layers: Sequence[int] = (3, 4, 6, 3),
                 widths: Sequence[int] = (64, 128, 256, 512), norm: str = "frozen") -> None:
        super().__init__()
        if norm not in _NORMS:
            raise ValueError(f"norm must be one of {sorted(_NORMS)}, got {norm!r}")
        if not 1 <= len(widths) <= len(layers):
            raise ValueError(f"need 1..{len(layers)} stage widths, got {len(widths)}")
        cls = Bottleneck if block == "bottleneck" else BasicBlock
        self.conv1 = nn.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = FrozenBatchNorm2d(widths[0])
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = widths[0]
        for i, (n, width) in enumerate(zip(layers, widths, strict=False)):  # widths: a prefix
            blocks = []
            for j in range(n):
                blocks.append(cls(cin, width, stride=2 if (j == 0 and i > 0) else 1))
                cin = width * cls.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.num_channels, self.num_stages = cin, len(widths)
        self.stride = 4 * 2 ** (len(widths) - 1)
        if norm == "batch":
            _swap_norms(self)

    def forward(self, x: torch.Tensor, sizes: Optional[Sizes] = None
                ) -> Tuple[torch.Tensor, Optional[Sizes]]:
        x, sizes = masked(self.conv1, x, sizes)
        x = self.bn1(x).relu()
        x, sizes = masked(self.maxpool, x, sizes)  # inputs >= 0 after relu: 0 == -inf pad
        for i in range(1, self.num_stages + 1):
            for block in getattr(self, f"layer{i}"):
                x, sizes = block_forward(block, x, sizes)
        return x, sizes


_NORMS = {"frozen", "batch"}


def _swap_norms(module: nn.Module) -> None:
    """Replace every FrozenBatchNorm2d by a trainable BatchNorm2d (identical keys + counter)."""
    for name, child in module.named_children():
        if isinstance(child, FrozenBatchNorm2d):
            setattr(module, name, nn.BatchNorm2d(child.weight.numel(), eps=child.eps))
        else:
            _swap_norms(child)


class Backbone(nn.Module):
    """DETR's ``backbone.0``: a ResNet body; features plus the padding mask at its stride."""

    def __init__(self, block: str = "bottleneck", layers: Sequence[int] = (3, 4, 6, 3),
                 widths: Sequence[int] = (64, 128, 256, 512), norm: str = "frozen") -> None:
        super().__init__()
        self.body = ResNetBody(block, layers, widths, norm)
        self.num_channels, self.stride = self.body.num_channels, self.body.stride

    def forward(self, images: torch.Tensor,
                sizes: Optional[Sizes] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Features (B, C, h, w) and mask (B, h, w), True on padding (DETR convention)."""
        if sizes is None:  # no padding: no per-conv masking, nothing masked
            feats, _ = self.body(images, None)
            return feats, feats.new_zeros((feats.shape[0],) + feats.shape[-2:], dtype=torch.bool)
        feats, feat_sizes = self.body(images, sizes)
        return feats, ~valid_mask(feat_sizes, feats.shape[-2], feats.shape[-1])


def resnet_layers(depth: int) -> Tuple[str, List[int]]:
    """Block type and blocks per stage of torchvision's resnet18/34/50/101."""
    table = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
             50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3])}
    if depth not in table:
        raise ValueError(f"unsupported ResNet depth {depth}; choose from {sorted(table)}")
    return table[depth]
