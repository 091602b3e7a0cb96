"""Multi-head self-attention with iRPE, in the order of operations of the official DeiT code."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .rpe import RPEConfig, build_rpe

__all__ = ["RPEAttention"]


class RPEAttention(nn.Module):
    """ViT attention (qkv / proj linears, timm keys) plus optional iRPE on Q, K and V.

    logits = (q*scale) @ k^T + rpe_k(q*scale) + rpe_q(k*scale)^T; out = softmax @ v + rpe_v(attn).
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False,
                 qk_scale: Optional[float] = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 rpe_config: Optional[RPEConfig] = None) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rpe_q, self.rpe_k, self.rpe_v = build_rpe(rpe_config, head_dim, num_heads)

    def forward(self, x: torch.Tensor, height: Optional[int] = None,
                width: Optional[int] = None) -> torch.Tensor:
        """x (B, N, C); height/width give the patch grid (else sqrt(N) square, N - H*W skip)."""
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        if self.rpe_k is not None:
            attn = attn + self.rpe_k(q, height, width)
        if self.rpe_q is not None:
            attn = attn + self.rpe_q(k * self.scale, height, width).transpose(2, 3)
        attn = self.attn_drop(attn.softmax(dim=-1))
        out = attn @ v
        if self.rpe_v is not None:
            out = out + self.rpe_v(attn, height, width)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
