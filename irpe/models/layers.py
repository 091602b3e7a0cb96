# Follows the code of timm (Apache-2.0): see NOTICE.
"""Small ViT building blocks with timm-compatible parameter names (no timm dependency)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from ..attention import RPEAttention
from ..rpe import RPEConfig

__all__ = ["PatchEmbed", "ConvStem", "Mlp", "DropPath", "Block"]


class PatchEmbed(nn.Module):
    """Image to patch tokens with a strided conv (keys: proj.weight, proj.bias)."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3,
                 embed_dim: int = 768) -> None:
        super().__init__()
        self.img_size, self.patch_size = img_size, patch_size
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, int, int]:
        """Returns tokens (B, H*W, C) and the grid (H, W)."""
        x = self.proj(x)
        height, width = x.shape[-2:]
        return x.flatten(2).transpose(1, 2), height, width


class ConvStem(PatchEmbed):
    """Convolutional stem (Xiao et al. 2021): log2(patch) 3x3/2 conv-BN-ReLU, then 1x1 proj.

    Same interface and stride as PatchEmbed; ViTs with it train much faster from scratch on
    small datasets (the demo classifier). Keys: stem.{3i}.weight (conv), stem.{3i+1} (BN), proj.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3,
                 embed_dim: int = 768) -> None:
        super().__init__(img_size, patch_size, in_chans, embed_dim)
        steps = patch_size.bit_length() - 1
        if patch_size != 2 ** steps or steps < 1:
            raise ValueError(f"conv stem needs a power-of-two patch size, got {patch_size}")
        layers, cin = [], in_chans
        for i in range(steps):
            cout = embed_dim // 2 ** (steps - 1 - i)
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            cin = cout
        self.stem = nn.Sequential(*layers)
        self.proj = nn.Conv2d(cin, embed_dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, int, int]:
        return super().forward(self.stem(x))


class Mlp(nn.Module):
    """fc1 -> GELU -> dropout -> fc2 -> dropout."""

    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drop whole residual branches per sample while training."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)); x + mlp(norm2(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 norm_eps: float = 1e-6, rpe_config: Optional[RPEConfig] = None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = RPEAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop,
                                 proj_drop=drop, rpe_config=rpe_config)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x: torch.Tensor, height: Optional[int] = None,
                width: Optional[int] = None) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), height, width))
        return x + self.drop_path(self.mlp(self.norm2(x)))
