"""Dispatch of rpe_attention to the fused paths: mode switch, support checks, op inputs.

Mode, an :data:`irpe.switch.Switch`: ``set_fused_attention("auto"|"on"|"off")`` (``irpe serve``:
the ``fused_attention`` setting) or the env var IRPE_FUSED_ATTENTION (auto, on, off; the older
spellings of irpe.switch.SWITCH_ALIASES too), read ONCE when this module is imported
(:func:`mode_from_env`; the function wins). auto and on = the Triton kernel on CUDA when
supported and the SDPA-based CPU path (irpe.fused.cpu) on CPU; on runs the Triton kernel on CPU
tensors instead when TRITON_INTERPRET=1 (tests); off = the unfused (manual) path everywhere.
Unsupported cases take the unfused path, never an error.
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ..bucket import (
    bucket_ids,
    bucket_ids_traceable,
    coefficients,
    ids_from_offsets,
    num_buckets,
    piecewise_index,
    piecewise_index_traceable,
)
from ..idcache import BUCKET_IDS
from ..rpe import Encoding, GridSize, attention_grid, iRPE, rpe_parts
from ..switch import SWITCHES, Switch, parse_switch
from .launch import MAX_BUCKETS_V, MAX_HEAD_DIM, kernel_available
from .op import fused_rpe_attention

__all__ = ["ENV", "set_fused_attention", "set_fused_ids", "fused_mode", "mode_from_env",
           "fused_supported", "cpu_supported", "fused_attention"]

ENV = "IRPE_FUSED_ATTENTION"
_override: Optional[Switch] = None
Tensor = torch.Tensor


def mode_from_env() -> Switch:
    """``$IRPE_FUSED_ATTENTION`` (unset: auto); a bad value warns and gives auto, since an
    import must not fail on a variable (``irpe serve`` refuses it at start-up instead)."""
    text = os.environ.get(ENV, "")
    try:
        return parse_switch(text, "fused attention mode") if text.strip() else "auto"
    except ValueError as exc:
        warnings.warn(f"{ENV}: {exc}; using auto", stacklevel=2)
        return "auto"


_ENV_MODE: Switch = mode_from_env()  # the process's default, read once


def set_fused_attention(mode: Optional[Switch]) -> None:
    """Force the fused paths ("on") or the unfused one ("off"), or "auto"; None = the env
    var's mode again (as read at import). Only the three words (the older spellings are for
    settings and the variable)."""
    global _override
    if mode is not None and mode not in SWITCHES:
        raise ValueError(f"unknown fused attention mode {mode!r}; expected auto, on or off")
    _override = mode


def fused_mode() -> Switch:
    """The effective mode: the function's override, else IRPE_FUSED_ATTENTION as read at
    import, else auto."""
    return _override if _override is not None else _ENV_MODE


def exporting() -> bool:
    """True while torch.onnx / jit tracing / torch.export record a graph (keep the manual ops)."""
    return (torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()
            or torch.jit.is_scripting() or torch.compiler.is_exporting())


_CAPABILITY: Dict[int, Tuple[int, int]] = {}


def _capability(device: torch.device) -> Tuple[int, int]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITY[index]


def fused_supported(q: Tensor, k: Tensor, rpe_q: Optional[Encoding], rpe_k: Optional[Encoding],
                    rpe_v: Optional[Encoding], height: GridSize, width: GridSize,
                    dropout: Optional[nn.Dropout]) -> bool:
    """Whether this call may take the fused kernel (mode, device, shapes, no export/dropout)."""
    mode = fused_mode()
    if mode == "off" or exporting() or q.shape != k.shape or q.dim() != 4:
        return False
    if q.device.type != "cuda" and mode != "on":
        return False
    if not kernel_available(q.device) or q.dtype not in (torch.float16, torch.bfloat16,
                                                         torch.float32):
        return False
    if q.shape[-1] > MAX_HEAD_DIM or isinstance(height, torch.Tensor):
        return False
    if q.is_cuda and _capability(q.device) < ((8, 0) if q.dtype == torch.bfloat16 else (7, 5)):
        return False  # Triton's dot: sm_75+ (fp16/fp32), bf16 from sm_80
    if dropout is not None and dropout.training and dropout.p > 0:
        return False
    if any(m.traceable or m.fixed_grid for m in rpe_parts(rpe_q, rpe_k, rpe_v)):
        return False
    return sum(m.num_buckets for m in rpe_parts(rpe_v)) <= MAX_BUCKETS_V


def cpu_supported(q: Tensor, k: Tensor, rpe_q: Optional[Encoding], rpe_k: Optional[Encoding],
                  rpe_v: Optional[Encoding], height: GridSize,
                  dropout: Optional[nn.Dropout]) -> bool:
    """Whether this call may take the CPU path (irpe.fused.cpu): CPU self-attention with iRPE,
    mode auto/on (on with the Triton interpreter on means the kernel), no export/dropout."""
    mode = fused_mode()
    if mode == "off" or q.device.type != "cpu" or exporting() or q.dim() != 4:
        return False
    if mode == "on" and kernel_available(q.device):
        return False  # TRITON_INTERPRET=1 and the kernel forced: the kernel runs
    if q.shape[:3] != k.shape[:3] or isinstance(height, torch.Tensor):
        return False
    if dropout is not None and dropout.training and dropout.p > 0:
        return False
    parts = rpe_parts(rpe_q, rpe_k, rpe_v)
    return bool(parts) and not any(m.traceable or m.fixed_grid for m in parts)


_ID_MODES = ("table", "matrix")
_id_mode = ["table"]


def set_fused_ids(mode: str) -> None:
    """Bucket ids for the kernel: "table" (default; relative-offset tables, O(L) memory) or
    "matrix" (the (L, L) id matrices of the unfused path, int32)."""
    if mode not in _ID_MODES:
        raise ValueError(f"unknown fused id mode {mode!r}; expected table or matrix")
    _id_mode[0] = mode


def _offset_ids(m: iRPE, height: int, width: int, skip: int, traceable: bool) -> Tensor:
    """Ids of every relative offset (dr, dc) of the grid, row-major over (2h-1, 2w-1), then the
    skip bucket: the same piecewise math as the unfused ids (so exact for every method)."""
    dr = torch.arange(1 - height, height).view(-1, 1).expand(-1, 2 * width - 1)
    dc = torch.arange(1 - width, width).view(1, -1).expand(2 * height - 1, -1)
    if traceable:
        coef = coefficients(m.ratio)
        ids = ids_from_offsets(m.method, dr.float(), dc.float(), m.ratio,
                               lambda x: piecewise_index_traceable(x, coef))
    else:
        ids = ids_from_offsets(m.method, dr, dc, m.ratio, lambda x: piecewise_index(x, m.ratio))
    extra = num_buckets(m.method, m.ratio, 0) if skip > 0 else 0
    return torch.cat([ids.reshape(-1), ids.new_full((1,), extra)])


def _build_ids(parts: List[iRPE], grid: Tuple[int, int, int], device: torch.device,
               traceable: bool) -> Tensor:
    height, width, skip = grid
    planes, offset = [], 0
    for m in parts:
        if _id_mode[0] == "table":
            ids = _offset_ids(m, height, width, skip, traceable)
        elif traceable:
            ids = bucket_ids_traceable(m.method, m.ratio, height, width, skip)
        else:
            ids = bucket_ids(m.method, m.ratio, height, width, skip)
        planes.append(ids.to(torch.int32) + offset)
        offset += m.num_buckets
    return torch.stack(planes).to(device)


def _ids_stack(parts: List[iRPE], grid: Tuple[int, int, int], device: torch.device) -> Tensor:
    """int32 ids on ``device`` (relative-offset tables or (L, L) matrices, one plane per part,
    offset by the previous parts' bucket counts), shared by all layers through the process's
    bucket-id cache (irpe.idcache: bounded by bytes, counted in serve's metrics). Under
    torch.compile a warm entry is read as is and a cold one is built in-graph (no graph break)."""
    key = ("fused", _id_mode[0], tuple((m.method, m.ratio) for m in parts), grid,
           torch.device(device))
    if torch.compiler.is_compiling():
        ids = BUCKET_IDS.peek(key)
        return ids if ids is not None else _build_ids(parts, grid, device, traceable=True)
    return BUCKET_IDS.get_or_build(key, lambda: _build_cached(parts, grid, device))


@torch.inference_mode(False)  # a normal tensor even if first built under inference_mode,
def _build_cached(parts: List[iRPE], grid: Tuple[int, int, int], device: torch.device
                  ) -> Tensor:
    return _build_ids(parts, grid, device, traceable=False)  # so autograd may save it later


def _term(module: Optional[Encoding], x: Optional[Tensor], length: int,
          grid: Tuple[int, int, int], device: torch.device
          ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """(table (B|1,H|1,L,K_total), int32 ids) of a K or Q term; cross is concatenated."""
    parts = rpe_parts(module)
    if x is None or not parts:
        return None, None
    tables = [m.table(x) for m in parts]
    if len(tables) > 1:
        heads = max(t.shape[1] for t in tables)
        tables = [t.expand(t.shape[0], heads, length, -1) for t in tables]
    table = tables[0] if len(tables) == 1 else torch.cat(tables, dim=-1)
    return table, _ids_stack(parts, grid, device)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, rpe_q: Optional[Encoding],
                    rpe_k: Optional[Encoding], rpe_v: Optional[Encoding], height: Optional[int],
                    width: Optional[int], key_padding_mask: Optional[Tensor]) -> Tensor:
    """rpe_attention's result through the fused op (q, k, v (B, H, L, D))."""
    length, device = q.shape[2], q.device
    grid = attention_grid(rpe_q, rpe_k, rpe_v, length, height, width)
    qs = q * scale
    table_k, ids_k = _term(rpe_k, qs, length, grid, device)
    table_q, ids_q = _term(rpe_q, k * scale if rpe_q is not None else None, length, grid, device)
    parts_v = rpe_parts(rpe_v)
    ids_v = _ids_stack(parts_v, grid, device) if parts_v else None
    nbv = sum(m.num_buckets for m in parts_v)
    out, s = fused_rpe_attention(qs, k, v, table_k, ids_k, table_q, ids_q, ids_v, nbv,
                                 key_padding_mask, list(grid) if _id_mode[0] == "table" else None)
    if parts_v:
        weight_v = torch.cat([m.lookup_table_weight for m in parts_v], dim=-2)
        out = out + torch.matmul(s.to(q.dtype), weight_v.unsqueeze(0).to(q.dtype))
    return out
