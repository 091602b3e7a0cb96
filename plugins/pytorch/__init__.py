"""CUDA implementations of irpe::rpe_gather / irpe::rpe_scatter backed by plugins/kernels.

    from plugins import pytorch as irpe_cuda
    irpe_cuda.register()            # builds (JIT, cached) and registers; raises if impossible
    irpe_cuda.unavailable_reason()  # None, or why the CUDA ops cannot be built here

The extension is compiled with torch.utils.cpp_extension.load (cached under
TORCH_EXTENSIONS_DIR), which needs a CUDA build of torch and nvcc. On a CPU-only torch nothing
is built or registered and irpe.ops keeps its device-generic implementation (the CPU path is
never touched). Autograd and fake kernels stay the ones of irpe.ops: only the CUDA kernel of
each op is replaced. float64 CUDA tensors (not in the kernels) use torch.gather/scatter_add.
"""
from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType
from typing import Optional, Union

import torch

from irpe.bucket import Method, parse_method
from irpe.ops import check_inputs, gather_generic, register_kernels, scatter_generic

from ..kernel_sources import CUDA_SOURCES, KERNEL_DIR, METHOD_IDS, nvcc_path

__all__ = ["CudaOpsUnavailable", "unavailable_reason", "load", "register", "is_registered",
           "gather_grid", "scatter_grid", "bucket_ids"]

EXTENSION_NAME = "irpe_cuda_ops"
_lock = threading.Lock()
_module = None
_registered = False


class CudaOpsUnavailable(RuntimeError):
    """The CUDA ops cannot be built or used in this environment (the message says why)."""


def unavailable_reason() -> Optional[str]:
    """None if the extension can be built here, else a one-line reason."""
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None): "
                "the irpe CUDA ops need a CUDA build of torch; irpe.ops keeps its CPU path")
    if nvcc_path() is None:
        return "nvcc not found (set CUDA_HOME/CUDACXX or put the CUDA toolkit on PATH)"
    return None


def load(verbose: bool = False) -> ModuleType:
    """Build (first call; cached on disk by torch) and import the extension module."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        reason = unavailable_reason()
        if reason:
            raise CudaOpsUnavailable(reason)
        from torch.utils.cpp_extension import load as load_extension
        sources = [str(Path(__file__).with_name("ext.cpp"))] + \
                  [str(KERNEL_DIR / s) for s in CUDA_SOURCES]
        _module = load_extension(
            name=EXTENSION_NAME, sources=sources, extra_include_paths=[str(KERNEL_DIR)],
            extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], verbose=verbose)
        return _module


def _gather_cuda(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    if table.dtype == torch.float64:  # not in the kernels: irpe.ops' torch formulation
        return gather_generic(table, index)
    check_inputs(table, index, "rpe_gather", broadcast_rows=True)
    table = table.expand(-1, -1, index.shape[0], -1)  # a 1-row table: row stride 0 (free)
    return _module.gather(table, index)


def _scatter_cuda(attn: torch.Tensor, index: torch.Tensor, num_buckets: int) -> torch.Tensor:
    if attn.dtype == torch.float64:
        return scatter_generic(attn, index, num_buckets)
    check_inputs(attn, index, "rpe_scatter", same_lk=True)
    return _module.scatter(attn, index, num_buckets)


def register(verbose: bool = False) -> None:
    """Build the extension and make it the CUDA kernel of both irpe ops (idempotent)."""
    global _registered
    load(verbose)
    with _lock:
        if not _registered:
            register_kernels("cuda", gather=_gather_cuda, scatter=_scatter_cuda)
            _registered = True


def is_registered() -> bool:
    return _registered


def _grid_args(method: Union[str, int, Method], ratio: float, height: int, width: int,
               skip: int) -> tuple:
    m = parse_method(method)
    if m not in METHOD_IDS:
        raise ValueError(f"method {m.value!r} has no single bucket map; use cross_rows/cols")
    return METHOD_IDS[m], float(ratio), int(height), int(width), int(skip)


def gather_grid(table: torch.Tensor, method: Union[str, int, Method], ratio: float,
                height: int, width: int, skip: int = 0) -> torch.Tensor:
    """rpe_gather with ids computed in the kernel (no index tensor); Lq = skip + H*W."""
    _check_grid_input(table, height, width, skip)
    args = _grid_args(method, ratio, height, width, skip)
    return load().gather_grid(table, *args)


def scatter_grid(attn: torch.Tensor, method: Union[str, int, Method], ratio: float,
                 height: int, width: int, skip: int = 0) -> torch.Tensor:
    """rpe_scatter with ids computed in the kernel; K = num_buckets(method, ratio, skip)."""
    _check_grid_input(attn, height, width, skip)
    if attn.shape[3] != attn.shape[2]:
        raise ValueError(f"scatter_grid: self-attention only (Lk = Lq), got {tuple(attn.shape)}")
    args = _grid_args(method, ratio, height, width, skip)
    return load().scatter_grid(attn, *args)


def bucket_ids(method: Union[str, int, Method], ratio: float, height: int, width: int,
               skip: int = 0, device: Union[str, torch.device] = "cuda") -> torch.Tensor:
    """int32 (skip+H*W)^2 id table computed on the GPU (equals irpe.bucket_ids)."""
    args = _grid_args(method, ratio, height, width, skip)
    return load().bucket_ids(*args, torch.device(device))


def _check_grid_input(x: torch.Tensor, height: int, width: int, skip: int) -> None:
    if x.dim() != 4:
        raise ValueError(f"expected a 4-D tensor [B,H,L,*], got shape {tuple(x.shape)}")
    if height < 1 or width < 1 or skip < 0:
        raise ValueError(f"grid must be at least 1x1 and skip >= 0, got {height}x{width}+{skip}")
    if x.shape[2] != skip + height * width:
        raise ValueError(f"L = {x.shape[2]} but skip + H*W = {skip + height * width}")
