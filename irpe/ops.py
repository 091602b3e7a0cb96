"""Custom ops ``irpe::rpe_gather`` and ``irpe::rpe_scatter`` (torch.library).

rpe_gather(table[B,H,Lq|1,K], index[Lq,Lk]) -> out[B,H,Lq,Lk],
    out[b,h,i,j] = table[b,h,i,index[i,j]]
rpe_scatter(attn[B,H,Lq,Lk], index[Lq,Lk], K) -> out[B,H,Lq,K],
    out[b,h,i,t] = sum_{j: index[i,j]=t} attn[b,h,i,j]

They are each other's adjoint, so each one's backward is the other. The default implementation
below is device-generic (torch.gather / scatter_add with fp32 accumulation); a device kernel
plugs in with ``rpe_gather.register_kernel("cuda")`` (see :func:`register_kernels`) without
touching the autograd or fake registrations. B and H of ``table``/``attn`` may be broadcast
(size 1 or stride 0); index may be int32 or int64. A gather table with ONE query row is
broadcast over the index's Lq rows: with the table flattened to (B,H,1,L*K) and index j*K+id(j,i)
this gives the transposed iRPE-Q term without materializing a transpose (see irpe.rpe).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch

__all__ = ["rpe_gather", "rpe_scatter", "register_kernels", "check_inputs", "gather_generic",
           "scatter_generic", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


def check_inputs(x: torch.Tensor, index: torch.Tensor, name: str,
                 broadcast_rows: bool = False, same_lk: bool = False) -> None:
    """ValueError unless ``x`` is [B,H,Lq|1,*] of a supported dtype and ``index`` int [Lq,Lk]
    (``same_lk``: x's last dim is Lk); device kernels (plugins/pytorch) check with it too."""
    if x.dim() != 4:
        raise ValueError(f"{name}: expected a 4-D tensor [B,H,Lq,*], got shape {tuple(x.shape)}")
    if index.dim() != 2 or index.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{name}: index must be 2-D int32/int64, got {tuple(index.shape)} "
                         f"{index.dtype}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}: unsupported dtype {x.dtype}")
    if x.shape[2] != index.shape[0] and not (broadcast_rows and x.shape[2] == 1):
        raise ValueError(f"{name}: Lq mismatch, tensor has {x.shape[2]}, "
                         f"index has {index.shape[0]}")
    if same_lk and x.shape[3] != index.shape[1]:
        raise ValueError(f"{name}: Lk mismatch, attn has {x.shape[3]}, index has {index.shape[1]}")


def gather_generic(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rpe_gather with torch.gather on any device (also the CUDA ops' float64 path)."""
    check_inputs(table, index, "rpe_gather", broadcast_rows=True)
    b, h, _, k = table.shape
    lq, lk = index.shape
    idx = index.to(device=table.device, dtype=torch.long).expand(b, h, lq, lk)
    return torch.gather(table.expand(b, h, lq, k), 3, idx)


def scatter_generic(attn: torch.Tensor, index: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """rpe_scatter with scatter_add on any device, fp32 accumulation (float64 kept as is)."""
    check_inputs(attn, index, "rpe_scatter", same_lk=True)
    b, h, lq, lk = attn.shape
    acc = torch.float64 if attn.dtype == torch.float64 else torch.float32
    idx = index.to(device=attn.device, dtype=torch.long).expand(b, h, lq, lk)
    out = attn.new_zeros((b, h, lq, num_buckets), dtype=acc)
    out.scatter_add_(3, idx, attn.to(acc))
    return out.to(attn.dtype)


@torch.library.custom_op("irpe::rpe_gather", mutates_args=())
def rpe_gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gather per-query bucket values into the Lq x Lk attention layout."""
    return gather_generic(table, index)


@torch.library.custom_op("irpe::rpe_scatter", mutates_args=())
def rpe_scatter(attn: torch.Tensor, index: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Sum attention weights that fall into the same bucket (fp32 accumulation)."""
    return scatter_generic(attn, index, num_buckets)


@rpe_gather.register_fake
def _gather_fake(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return table.new_empty((table.shape[0], table.shape[1], index.shape[0], index.shape[1]))


@rpe_scatter.register_fake
def _scatter_fake(attn: torch.Tensor, index: torch.Tensor, num_buckets: int) -> torch.Tensor:
    b, h, lq, _ = attn.shape
    return attn.new_empty((b, h, lq, num_buckets))


# ctx: the autograd context, an attribute bag (torch types it Any)
def _gather_setup(ctx: Any, inputs: Tuple[torch.Tensor, torch.Tensor],
                  output: torch.Tensor) -> None:
    table, index = inputs
    ctx.save_for_backward(index)
    ctx.num_buckets = table.shape[3]
    ctx.broadcast = table.shape[2] == 1 and index.shape[0] != 1


def _gather_backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[torch.Tensor, None]:
    (index,) = ctx.saved_tensors
    if ctx.broadcast:  # one table row served every query: sum over all (i, j) at once
        b, h = grad_out.shape[:2]
        flat = grad_out.contiguous().reshape(b, h, 1, -1)
        return rpe_scatter(flat, index.reshape(1, -1), ctx.num_buckets), None
    return rpe_scatter(grad_out.contiguous(), index, ctx.num_buckets), None


def _scatter_setup(ctx: Any, inputs: Tuple[torch.Tensor, torch.Tensor, int],
                   output: torch.Tensor) -> None:
    _, index, _ = inputs
    ctx.save_for_backward(index)


def _scatter_backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
    (index,) = ctx.saved_tensors
    return rpe_gather(grad_out.contiguous(), index), None, None


rpe_gather.register_autograd(_gather_backward, setup_context=_gather_setup)
rpe_scatter.register_autograd(_scatter_backward, setup_context=_scatter_setup)


def register_kernels(device_type: str, gather: Optional[Callable] = None,
                     scatter: Optional[Callable] = None) -> None:
    """Plug device kernels (e.g. the CUDA ones of plugins/) into the ops for ``device_type``."""
    if gather is not None:
        rpe_gather.register_kernel(device_type)(gather)
    if scatter is not None:
        rpe_scatter.register_kernel(device_type)(scatter)
