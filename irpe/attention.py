# Follows the code of facebookresearch/deit (Apache-2.0): see NOTICE.
"""Multi-head self-attention with iRPE, in the order of operations of the official DeiT code."""
from __future__ import annotations

from typing import Optional, cast

import torch
import torch.nn.functional as F
from torch import nn

from .fused.cpu import cpu_attention
from .fused.dispatch import cpu_supported, exporting, fused_attention, fused_supported
from .rpe import Encoding, GridSize, RPEConfig, build_rpe

__all__ = ["RPEAttention", "rpe_attention", "unfused_attention"]


def _plain_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                key_padding_mask: Optional[torch.Tensor], dropout: Optional[nn.Dropout]
                ) -> torch.Tensor:
    """Attention without iRPE through SDPA (FlashAttention / memory-efficient kernels)."""
    mask = None
    if key_padding_mask is not None:
        mask = ~key_padding_mask[:, None, None, :].bool()
    p = dropout.p if dropout is not None and dropout.training else 0.0
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)


def rpe_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  rpe_q: Optional[Encoding] = None, rpe_k: Optional[Encoding] = None,
                  rpe_v: Optional[Encoding] = None, height: GridSize = None,
                  width: GridSize = None,
                  key_padding_mask: Optional[torch.Tensor] = None,
                  dropout: Optional[nn.Dropout] = None) -> torch.Tensor:
    """Scaled dot-product attention with iRPE terms, official order; q, k, v (B, H, L, D).

    The key padding mask (B, Lk), True = padding, is applied after the iRPE terms are added.
    Without iRPE terms it runs SDPA (except while exporting: the graph keeps the manual ops);
    with them, the fused Triton kernel where :func:`irpe.fused.fused_supported` says so, on
    CPU the SDPA-based path where :func:`irpe.fused.cpu_supported` says so (irpe.fused.cpu).
    """
    if rpe_q is None and rpe_k is None and rpe_v is None and not exporting():
        return _plain_sdpa(q, k, v, scale, key_padding_mask, dropout)
    # both fused paths take int grid sizes only: their checks refuse traced (tensor) sizes
    if (rpe_q is not None or rpe_k is not None or rpe_v is not None) and fused_supported(
            q, k, rpe_q, rpe_k, rpe_v, height, width, dropout):
        return fused_attention(q, k, v, scale, rpe_q, rpe_k, rpe_v, cast("Optional[int]", height),
                               cast("Optional[int]", width), key_padding_mask)
    if cpu_supported(q, k, rpe_q, rpe_k, rpe_v, height, dropout):
        return cpu_attention(q, k, v, scale, rpe_q, rpe_k, rpe_v, cast("Optional[int]", height),
                             cast("Optional[int]", width), key_padding_mask)
    return unfused_attention(q, k, v, scale, rpe_q, rpe_k, rpe_v, height, width,
                             key_padding_mask, dropout)


def unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      rpe_q: Optional[Encoding] = None, rpe_k: Optional[Encoding] = None,
                      rpe_v: Optional[Encoding] = None, height: GridSize = None,
                      width: GridSize = None,
                      key_padding_mask: Optional[torch.Tensor] = None,
                      dropout: Optional[nn.Dropout] = None) -> torch.Tensor:
    """The manual path (L x L logits), the official order of operations; the export graph."""
    q = q * scale
    attn = q @ k.transpose(-2, -1)
    if rpe_k is not None:
        attn = attn + rpe_k(q, height, width)
    if rpe_q is not None:  # rpe_q(k * scale)^T, gathered already transposed when exported
        attn = attn + rpe_q.forward_transposed(k * scale, height, width)
    if key_padding_mask is not None:
        attn = attn.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    attn = attn.softmax(dim=-1)
    if dropout is not None:
        attn = dropout(attn)
    out = attn @ v
    if rpe_v is not None:
        out = out + rpe_v(attn, height, width)
    return out


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
        out = rpe_attention(q, k, v, self.scale, self.rpe_q, self.rpe_k, self.rpe_v, height, width,
                            dropout=self.attn_drop)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
