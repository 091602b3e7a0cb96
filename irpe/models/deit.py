# Follows the code of facebookresearch/deit (Apache-2.0), timm (Apache-2.0) and
# microsoft/Cream iRPE (MIT): see NOTICE.
"""DeiT / ViT classifiers with optional iRPE, keys equal to the official DeiT and iRPE models.

Registered names: ``deit_{tiny,small,base}_patch16_224`` (no iRPE, the overhead baseline),
``deit_{tiny,small,base}_distilled_patch16_224`` and the official iRPE variants
``deit_*_patch16_224_ctx_{product_50,euc_20,quant_51,cross_56}_shared_{k,qk,qkv}``.
"""
from __future__ import annotations

import functools
import re
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..bucket import Method, parse_method
from ..rpe import RPEConfig
from .layers import Block, ConvStem, PatchEmbed
from .registry import register_model

__all__ = ["VisionTransformer", "DEIT_ARCHS", "DEIT_MODELS", "IRPE_VARIANTS"]


class VisionTransformer(nn.Module):
    """ViT with cls (and optional distillation) token, absolute pos embed and iRPE blocks.

    The patch grid (H, W) is passed to every attention, so iRPE is exact on non-square inputs;
    inputs of another size than ``img_size`` get a bicubically resampled position embedding.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, embed_dim: int = 768, depth: int = 12,
                 num_heads: int = 12, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, rpe_config: Optional[RPEConfig] = None,
                 distilled: bool = False, stem: str = "patch") -> None:
        super().__init__()
        self.num_classes, self.embed_dim, self.rpe_config = num_classes, embed_dim, rpe_config
        self.num_prefix = 2 if distilled else 1
        if rpe_config is not None and rpe_config.skip < 1:
            raise ValueError(f"rpe_config.skip must be >= 1: the model has {self.num_prefix} "
                             "prefix token(s) that share iRPE's extra bucket")
        if stem not in ("patch", "conv"):
            raise ValueError(f"stem must be 'patch' (official) or 'conv', got {stem!r}")
        embed = ConvStem if stem == "conv" else PatchEmbed
        self.patch_embed = embed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distilled else None
        num_pos = self.patch_embed.num_patches + self.num_prefix
        self.pos_embed = nn.Parameter(torch.zeros(1, num_pos, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, dpr[i],
                  rpe_config=rpe_config) for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.head_dist = None
        if distilled:
            self.head_dist = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    def init_weights(self) -> None:
        """timm/DeiT init: trunc-normal(0.02) tokens and linears; iRPE tables stay zero."""
        for p in (self.pos_embed, self.cls_token, self.dist_token):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set:
        """Parameter names excluded from weight decay (tokens, pos embed, iRPE tables)."""
        names = {"pos_embed", "cls_token", "dist_token"}
        return names | {n for n, _ in self.named_parameters() if "lookup_table" in n}

    def _pos_embed(self, height: int, width: int) -> torch.Tensor:
        gh, gw = self.patch_embed.grid_size
        if (height, width) == (gh, gw):
            return self.pos_embed
        prefix, grid = self.pos_embed[:, :self.num_prefix], self.pos_embed[:, self.num_prefix:]
        grid = grid.reshape(1, gh, gw, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(height, width), mode="bicubic", align_corners=False)
        return torch.cat([prefix, grid.flatten(2).transpose(1, 2)], dim=1)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised token features (B, prefix + H*W, C)."""
        x, height, width = self.patch_embed(x)
        prefix = [self.cls_token.expand(x.shape[0], -1, -1)]
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(x.shape[0], -1, -1))
        x = torch.cat(prefix + [x], dim=1) + self._pos_embed(height, width)
        x = self.pos_drop(x)
        for blk in self.blocks:
            x = blk(x, height, width)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """Logits (B, num_classes); distilled models average both heads in eval mode (in train
        mode both heads' logits)."""
        feats = self.forward_features(x)
        logits = self.head(feats[:, 0])
        if self.head_dist is None:
            return logits
        logits_dist = self.head_dist(feats[:, 1])
        return (logits, logits_dist) if self.training else (logits + logits_dist) / 2


DEIT_ARCHS = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}

# name suffix -> (ratio, method, rpe_on); all contextual, shared head, skip = 1 (cls token)
IRPE_VARIANTS = {
    "ctx_product_50_shared_k": (1.9, "product", "k"),
    "ctx_product_50_shared_qk": (1.9, "product", "qk"),
    "ctx_product_50_shared_qkv": (1.9, "product", "qkv"),
    "ctx_euc_20_shared_k": (20, "euc", "k"),
    "ctx_quant_51_shared_k": (33, "quant", "k"),
    "ctx_cross_56_shared_k": (20, "cross", "k"),
}

_ZOO_URL = "https://github.com/wkcn/iRPE-model-zoo/releases/download/1.0/{}.pth"
_NAME = re.compile(r"deit_(tiny|small|base)(_distilled)?_patch16_224(?:_(ctx_\w+))?")

# Every published name, spelled out (grep finds it); arch, distillation and iRPE variant are
# read from the name. Second field: published ImageNet top-1 (iRPE zoo models with one have an
# official checkpoint URL).
DEIT_MODELS = (
    ("deit_tiny_patch16_224", 72.2),
    ("deit_small_patch16_224", 79.8),
    ("deit_base_patch16_224", 81.8),
    ("deit_tiny_distilled_patch16_224", None),
    ("deit_small_distilled_patch16_224", None),
    ("deit_base_distilled_patch16_224", None),
    ("deit_tiny_patch16_224_ctx_product_50_shared_k", 73.7),
    ("deit_small_patch16_224_ctx_product_50_shared_k", 80.9),
    ("deit_small_patch16_224_ctx_product_50_shared_qk", 81.0),
    ("deit_small_patch16_224_ctx_product_50_shared_qkv", 81.2),
    ("deit_base_patch16_224_ctx_product_50_shared_k", 82.3),
    ("deit_base_patch16_224_ctx_product_50_shared_qkv", 82.8),
    ("deit_small_patch16_224_ctx_euc_20_shared_k", None),
    ("deit_small_patch16_224_ctx_quant_51_shared_k", None),
    ("deit_small_patch16_224_ctx_cross_56_shared_k", None),
)


def _deit_config(name: str) -> dict:
    """Builder config of a DeiT name (ViT size, distillation token, iRPE variant)."""
    match = _NAME.fullmatch(name)
    if match is None or (match[3] is not None and match[3] not in IRPE_VARIANTS):
        raise ValueError(f"not a DeiT model name: {name!r}")
    arch, distilled, variant = match[1], match[2] is not None, match[3]
    rpe = None
    if variant is not None:
        ratio, method, on = IRPE_VARIANTS[variant]
        rpe = RPEConfig(ratio=ratio, method=parse_method(method), mode="contextual",
                        shared_head=True, skip=1, on=on)
    dim, heads = DEIT_ARCHS[arch]
    return dict(img_size=224, patch_size=16, embed_dim=dim, depth=12, num_heads=heads,
                mlp_ratio=4.0, qkv_bias=True, distilled=distilled, rpe_config=rpe)


def _register_deit(name: str, top1: Optional[float]) -> None:
    config = _deit_config(name)
    url = _ZOO_URL.format(name) if top1 is not None and config["rpe_config"] else None
    register_model(name, family="deit", config=config, url=url, top1=top1)(
        functools.partial(VisionTransformer, **config))


for _name, _top1 in DEIT_MODELS:
    _register_deit(_name, _top1)


# Demo classifier for the synthetic shapes set (irpe.data.shapes): 64x64 input, conv stem to an
# 8x8 grid (a patchify stem sits at chance for epochs on this set; the conv stem learns at once),
# iRPE product/contextual on Q, K and V; weights bundled (irpe/demo/, `make demo-models`).
_SHAPES = dict(img_size=64, patch_size=8, embed_dim=96, depth=4, num_heads=3, mlp_ratio=4.0,
               qkv_bias=True, num_classes=8, distilled=False, stem="conv",
               rpe_config=RPEConfig(ratio=1.9, method=Method.PRODUCT, mode="contextual",
                                    shared_head=True, skip=1, on="qkv"))


@register_model("deit_shapes_irpe", family="deit", config=_SHAPES,
                preprocess=dict(size=64, crop_pct=1.0), weights="deit_shapes_irpe.safetensors")
def deit_shapes_irpe(**overrides) -> VisionTransformer:
    return VisionTransformer(**{**_SHAPES, **overrides})
