# Follows the code of microsoft/Cream iRPE (MIT): see NOTICE.
"""Bucket index math of iRPE: piecewise index, the four 2-D methods, skip tokens, bucket counts.

Semantics follow the official implementation (microsoft/Cream, iRPE/) bit for bit, because
checkpoints depend on them. Two implementations of the ids exist:

* :func:`bucket_ids` - cached, built once per (method, coefficients, H, W, skip) from the full
  L x L offset tensor with masked assignment, the way the official code does.
* :func:`bucket_ids_traceable` - pure tensor ops (``where`` instead of masking, sizes taken from
  H and W that may be tensors), so a traced/exported graph recomputes the ids for any resolution.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Dict, Union

import torch

from .idcache import BUCKET_IDS

__all__ = [
    "Method", "METHOD_IDS", "Coefficients", "parse_method", "coefficients", "num_buckets",
    "piecewise_index", "piecewise_index_traceable", "ids_from_offsets", "bucket_ids",
    "bucket_ids_traceable", "relative_offsets",
]

IntOrTensor = Union[int, torch.Tensor]


class Method(str, Enum):
    """The 2-D mapping methods of the paper; CROSS is split into a rows and a cols part."""

    EUCLIDEAN = "euc"
    QUANT = "quant"
    PRODUCT = "product"
    CROSS = "cross"
    CROSS_ROWS = "cross_rows"
    CROSS_COLS = "cross_cols"


# The numeric ids of the official METHOD class; the C kernels (IRPE_METHOD_* in
# plugins/kernels/irpe_bucket.h) and the plugins' name table (irpe_methods.h) use the same ids
# (tests/test_single_sources.py checks both against this table).
METHOD_IDS = {Method.EUCLIDEAN: 0, Method.QUANT: 1, Method.PRODUCT: 3, Method.CROSS: 4,
              Method.CROSS_ROWS: 41, Method.CROSS_COLS: 42}

_ALIASES: Dict[Union[str, int], Method] = {
    **{m.value: m for m in Method}, "euclidean": Method.EUCLIDEAN, "quantization": Method.QUANT,
    **{number: m for m, number in METHOD_IDS.items()},
}


def parse_method(method: Union[str, int, Method]) -> Method:
    """Map a method name, alias or official numeric id to :class:`Method`."""
    if isinstance(method, Method):
        return method
    key = method.lower() if isinstance(method, str) else method
    if key not in _ALIASES:
        names = sorted(k for k in _ALIASES if isinstance(k, str))
        raise ValueError(f"unknown iRPE method {method!r}; expected one of {names}")
    return _ALIASES[key]


@dataclass(frozen=True)
class Coefficients:
    """alpha, beta, gamma of the piecewise index function (Eq. 18), derived from ``ratio``."""

    alpha: float
    beta: float
    gamma: float

    @property
    def beta_int(self) -> int:
        return int(self.beta)


def coefficients(ratio: float) -> Coefficients:
    """Official coefficients: alpha = 1*ratio, beta = 2*ratio, gamma = 8*ratio."""
    if not ratio > 0:
        raise ValueError(f"ratio must be > 0, got {ratio}")
    return Coefficients(alpha=1 * ratio, beta=2 * ratio, gamma=8 * ratio)


def num_buckets(method: Union[str, Method], ratio: float, skip: int = 0) -> int:
    """Buckets allocated per table: (2b+1)^2 for product, 2b+1 otherwise, +1 if skip > 0."""
    method = parse_method(method)
    beta_int = coefficients(ratio).beta_int
    count = (2 * beta_int + 1) ** 2 if method == Method.PRODUCT else 2 * beta_int + 1
    return count + (1 if skip > 0 else 0)


def _log_bucket(abs_x: torch.Tensor, c: Coefficients) -> torch.Tensor:
    """The logarithmic branch for |x| > alpha: min(beta, round(alpha + ln(|x|/a)/ln(g/a)*(b-a)))."""
    y = c.alpha + torch.log(abs_x / c.alpha) / math.log(c.gamma / c.alpha) * (c.beta - c.alpha)
    return y.round().clip(max=c.beta)


def piecewise_index(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """Piecewise index (official, masked form): identity within alpha, log-compressed beyond.

    Returns int64 values in [-beta_int, beta_int]. Float inputs are rounded half-to-even.
    """
    c = coefficients(ratio)
    abs_x = x.abs()
    outside = abs_x > c.alpha
    y = (torch.sign(x[outside]) * _log_bucket(abs_x[outside], c)).to(torch.long)
    idx = x.round().to(torch.long) if x.is_floating_point() else x.clone().to(torch.long)
    idx[outside] = y
    return idx


def piecewise_index_traceable(x: torch.Tensor, c: Coefficients) -> torch.Tensor:
    """Piecewise index with ``where`` only (no data-dependent shapes, so it traces and exports);
    x is float, ``c`` the ratio's coefficients."""
    abs_x = x.abs()
    inside = abs_x <= c.alpha
    safe = torch.where(inside, torch.full_like(abs_x, c.alpha), abs_x)  # no log(0)
    y = torch.sign(x) * _log_bucket(safe, c)
    return torch.where(inside, x.round(), y).to(torch.long)


def relative_offsets(height: int, width: int) -> torch.Tensor:
    """diff[i, j] = pos_i - pos_j for row-major grid positions; shape (L, L, 2) int64."""
    rows = torch.arange(height).view(height, 1).expand(height, width)
    cols = torch.arange(width).view(1, width).expand(height, width)
    pos = torch.stack([rows, cols], 2).reshape(-1, 2)
    return pos[:, None, :] - pos[None, :, :]


def ids_from_offsets(method: Method, dr: torch.Tensor, dc: torch.Tensor, ratio: float,
                      piecewise: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Bucket ids of relative offsets (dr, dc) by ``method``'s composition, shared by the id
    matrices and the fused kernel's offset tables; ``piecewise`` is :func:`piecewise_index` or
    :func:`piecewise_index_traceable` (with the coefficients bound)."""
    beta_int = coefficients(ratio).beta_int
    if method == Method.PRODUCT:
        return (piecewise(dr) + beta_int) * (2 * beta_int + 1) + (piecewise(dc) + beta_int)
    if method == Method.EUCLIDEAN:
        dist = (dr * dr + dc * dc).float().sqrt().round()
    elif method == Method.QUANT:
        dist = dr * dr + dc * dc  # squared distance, no sqrt (as the official code)
    elif method == Method.CROSS_ROWS:
        dist = dr
    elif method == Method.CROSS_COLS:
        dist = dc
    else:
        raise ValueError(f"method {method.value!r} has no single bucket map; use cross_rows/cols")
    return piecewise(dist) + beta_int


@torch.inference_mode(False)  # a normal tensor even if first built under inference_mode
def _build_ids(method: Method, ratio: float, height: int, width: int, skip: int) -> torch.Tensor:
    diff = relative_offsets(height, width)
    ids = ids_from_offsets(method, diff[..., 0], diff[..., 1], ratio,
                            lambda x: piecewise_index(x, ratio))
    if skip > 0:
        length = height * width
        extra = num_buckets(method, ratio, skip=0)
        full = ids.new_full((skip + length, skip + length), extra)
        full[skip:, skip:] = ids
        ids = full
    ids = ids.contiguous()
    ids.requires_grad_(False)
    return ids


def bucket_ids(method: Union[str, Method], ratio: float, height: int, width: int,
               skip: int = 0) -> torch.Tensor:
    """Cached bucket ids, shape (skip + H*W, skip + H*W), int64 on CPU. Treat as read-only.

    Every pair involving one of the ``skip`` leading tokens maps to the single extra bucket.
    """
    method = parse_method(method)
    _check_grid(height, width, skip)
    key = (method, float(ratio), int(height), int(width), int(skip))
    return BUCKET_IDS.get_or_build(key, lambda: _build_ids(*key))  # LRU bounded by bytes


def _check_grid(height: int, width: int, skip: int) -> None:
    if height < 1 or width < 1:
        raise ValueError(f"grid must be at least 1x1, got {height}x{width}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")


def bucket_ids_traceable(method: Union[str, Method], ratio: float, height: IntOrTensor,
                         width: IntOrTensor, skip: int = 0,
                         device: torch.device | None = None) -> torch.Tensor:
    """Bucket ids computed with graph-friendly tensor ops from (possibly dynamic) H and W.

    Same values as :func:`bucket_ids`; height/width may be 0-d tensors or symbolic sizes so
    that a traced or exported graph is correct at every resolution.
    """
    method = parse_method(method)
    c = coefficients(ratio)
    # torch's stub types arange's end as a Python number; 0-d tensors and SymInts work (tracing)
    rows = torch.arange(height, device=device).view(-1, 1)  # type: ignore[arg-type]
    cols = torch.arange(width, device=device).view(1, -1)  # type: ignore[arg-type]
    r = (rows + cols * 0).reshape(-1).float()  # broadcast to (H, W) then flatten row-major
    k = (cols + rows * 0).reshape(-1).float()
    dr = r.view(-1, 1) - r.view(1, -1)
    dc = k.view(-1, 1) - k.view(1, -1)
    ids = ids_from_offsets(method, dr, dc, ratio, lambda x: piecewise_index_traceable(x, c))
    if skip > 0:
        extra = num_buckets(method, ratio, skip=0)
        ids = torch.nn.functional.pad(ids, (skip, 0, skip, 0), value=extra)
    return ids
