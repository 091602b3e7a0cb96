"""DETR transformer with iRPE in the encoder self-attention (keys as facebookresearch/detr).

Post-norm encoder/decoder layers; attention modules keep nn.MultiheadAttention's parameter names
(in_proj_weight, in_proj_bias, out_proj) plus the official iRPE ``rpe_{q,k,v}`` tables. Tensors
are batch-first (B, L, C) here; the math equals DETR's sequence-first code.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import rpe_attention
from ..rpe import RPEConfig, build_rpe

__all__ = ["RPEMultiheadAttention", "PositionEmbeddingSine", "Transformer"]


class RPEMultiheadAttention(nn.Module):
    """nn.MultiheadAttention-compatible weights with optional iRPE (hw = feature-map grid)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 rpe_config: Optional[RPEConfig] = None) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)
        self.rpe_q, self.rpe_k, self.rpe_v = build_rpe(rpe_config, self.head_dim, num_heads)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def _heads(self, x: torch.Tensor, part: int) -> torch.Tensor:
        e = self.in_proj_weight.shape[1]
        w = self.in_proj_weight[part * e:(part + 1) * e]
        y = F.linear(x, w, self.in_proj_bias[part * e:(part + 1) * e])
        return y.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None,
                hw: Optional[Sequence[int]] = None) -> torch.Tensor:
        """query (B, Lq, E), key/value (B, Lk, E); mask (B, Lk) True = padding; hw = (h, w)."""
        q, k, v = self._heads(query, 0), self._heads(key, 1), self._heads(value, 2)
        height, width = hw if hw is not None else (None, None)
        out = rpe_attention(q, k, v, self.head_dim ** -0.5, self.rpe_q, self.rpe_k, self.rpe_v,
                            height, width, key_padding_mask, self.dropout)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class PositionEmbeddingSine(nn.Module):
    """DETR's normalised sine embedding; padding-aware through the mask (True = padding)."""

    def __init__(self, num_pos_feats: int = 128, temperature: float = 10000.0) -> None:
        super().__init__()
        self.num_pos_feats, self.temperature, self.scale = num_pos_feats, temperature, 2 * math.pi

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, h, w) mask -> (B, 2*num_pos_feats, h, w) embedding."""
        not_mask = (~mask).float()
        y = not_mask.cumsum(1)
        x = not_mask.cumsum(2)
        y = y / (y[:, -1:, :] + 1e-6) * self.scale
        x = x / (x[:, :, -1:] + 1e-6) * self.scale
        i = torch.arange(self.num_pos_feats, dtype=torch.float32, device=mask.device)
        dim_t = self.temperature ** (2 * torch.div(i, 2, rounding_mode="floor")
                                     / self.num_pos_feats)
        def sincos(t: torch.Tensor) -> torch.Tensor:
            t = t[..., None] / dim_t
            return torch.stack((t[..., 0::2].sin(), t[..., 1::2].cos()), dim=4).flatten(3)

        return torch.cat((sincos(y), sincos(x)), dim=3).permute(0, 3, 1, 2)


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, dropout: float,
                 rpe_config: Optional[RPEConfig]) -> None:
        super().__init__()
        self.self_attn = RPEMultiheadAttention(d, heads, dropout, rpe_config)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                hw: Sequence[int]) -> torch.Tensor:
        qk = src + pos
        src = self.norm1(src + self.dropout(self.self_attn(qk, qk, src, mask, hw)))
        ffn = self.linear2(self.dropout(F.relu(self.linear1(src))))
        return self.norm2(src + self.dropout(ffn))


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = RPEMultiheadAttention(d, heads, dropout)
        self.multihead_attn = RPEMultiheadAttention(d, heads, dropout)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor,
                pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
        qk = tgt + query_pos
        tgt = self.norm1(tgt + self.dropout(self.self_attn(qk, qk, tgt)))
        attn = self.multihead_attn(tgt + query_pos, memory + pos, memory, mask)
        tgt = self.norm2(tgt + self.dropout(attn))
        ffn = self.linear2(self.dropout(F.relu(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout(ffn))


class _Stack(nn.Module):
    def __init__(self, layers: Iterable[nn.Module], norm: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if norm is not None:
            self.norm = norm


class Transformer(nn.Module):
    """Encoder (iRPE self-attention) + decoder returning every layer's normalised output."""

    def __init__(self, d_model: int = 256, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 rpe_config: Optional[RPEConfig] = None) -> None:
        super().__init__()
        self.d_model = d_model
        self.encoder = _Stack([EncoderLayer(d_model, nhead, dim_feedforward, dropout, rpe_config)
                               for _ in range(num_encoder_layers)])
        self.decoder = _Stack([DecoderLayer(d_model, nhead, dim_feedforward, dropout)
                               for _ in range(num_decoder_layers)], nn.LayerNorm(d_model))
        for p in self.parameters():  # DETR: xavier on every matrix, iRPE tables included
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src: torch.Tensor, mask: torch.Tensor, query_embed: torch.Tensor,
                pos: torch.Tensor) -> torch.Tensor:
        """src/pos (B, C, h, w), mask (B, h, w), queries (Q, C) -> (layers, B, Q, C)."""
        hw = src.shape[-2:]
        src, pos = src.flatten(2).transpose(1, 2), pos.flatten(2).transpose(1, 2)
        mask = mask.flatten(1)
        memory = src
        for layer in self.encoder.layers:
            memory = layer(memory, mask, pos, hw)
        query_pos = query_embed.unsqueeze(0).expand(src.shape[0], -1, -1)
        tgt, outs = torch.zeros_like(query_pos), []
        for layer in self.decoder.layers:
            tgt = layer(tgt, memory, mask, pos, query_pos)
            outs.append(self.decoder.norm(tgt))
        return torch.stack(outs)
