"""iRPE attention on CPU in one native kernel: libirpe_cpu_attention (plugins/cpu, C ABI
irpe_cpu_attention.h), the RPEAttention kernel of the ONNX Runtime and OpenVINO libraries
called through ctypes.

FlashAttention's pattern on a CPU: per block of query rows the logits, the iRPE-K/Q terms, the
softmax, the iRPE-V bucket sums and both products stay in the thread's cache; only q, k, v and
the output go through memory. Inference only (no autograd), float32, shared contextual tables,
no padding mask; irpe.fused.cpu (SDPA) takes every other call, and every call when the library
is not built (``make ort-ops``). The id tables are built once per shape in the kernel's format
and kept in the process's bucket-id cache (irpe.idcache).
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from ..idcache import BUCKET_IDS
from ..plugin_files import BUILD_DIR
from ..rpe import Encoding, iRPE

__all__ = ["LIBRARY_FILE", "ENV", "default_path", "set_cpu_library", "cpu_library",
           "records_grad", "library_supported", "library_attention"]

LIBRARY_FILE = "libirpe_cpu_attention.so"
ENV = "IRPE_CPU_ATTENTION_LIBRARY"  # the file; empty: none (the SDPA path); unset: the build's
Tensor = torch.Tensor
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
KINDS = ("k", "q", "v")  # irpe_cpu_attention_ids' kind 0, 1, 2


class _Args(ctypes.Structure):
    """irpe_cpu_attention_args (irpe_cpu_attention.h), field for field."""

    _fields_ = [("batch", _I64), ("heads", _I64), ("l", _I64), ("d", _I64),
                ("scale", ctypes.c_float), ("q", _P), ("k", _P), ("v", _P),
                ("in_stride", _I64 * 3), ("out", _P), ("out_stride", _I64 * 3),
                ("kk", _I64), ("wk", _P), ("idk", _P), ("kq", _I64), ("wq", _P), ("idq", _P),
                ("kv", _I64), ("wv", _P), ("idv", _P)]


class _Library:
    """The loaded library with its functions typed."""

    def __init__(self, path: Path) -> None:
        self.path, lib = path, ctypes.CDLL(str(path))
        self.pad = lib.irpe_cpu_attention_pad
        self.pad.argtypes, self.pad.restype = [_I64], _I64
        self.ids = lib.irpe_cpu_attention_ids
        self.ids.argtypes, self.ids.restype = [ctypes.c_int, _P, _I64, _I64, _P], ctypes.c_int
        self.run = lib.irpe_cpu_attention
        self.run.argtypes, self.run.restype = [ctypes.POINTER(_Args), ctypes.c_int], ctypes.c_int
        self.error = lib.irpe_cpu_attention_error
        self.error.argtypes, self.error.restype = [], ctypes.c_char_p
        self.simd = lib.irpe_cpu_attention_simd
        self.simd.argtypes, self.simd.restype = [], ctypes.c_char_p

    def check(self, status: int, what: str) -> None:
        """RuntimeError with the library's message for a failed call."""
        if status != 0:
            raise RuntimeError(f"{what}: {self.error().decode(errors='replace')}")


def default_path() -> Optional[Path]:
    """``$IRPE_CPU_ATTENTION_LIBRARY`` (empty: None), else the build's file (build/plugins/)."""
    text = os.environ.get(ENV)
    if text is None:
        return BUILD_DIR / LIBRARY_FILE
    return Path(text) if text.strip() else None


_lock = threading.Lock()
_DEFAULT = default_path()  # read once, at import
_path: Optional[Path] = _DEFAULT
_loaded: Dict[Path, Optional[_Library]] = {}  # per file, looked for once (None: none usable)


def set_cpu_library(path: Union[str, Path, None, bool]) -> None:
    """Use the library file at ``path``; None: no library (the SDPA path for every call, e.g.
    to compare the two); True: the default again (``$IRPE_CPU_ATTENTION_LIBRARY`` as read at
    import, else the build's)."""
    global _path
    with _lock:
        if path is True:
            _path = _DEFAULT
        elif path is None or path is False:
            _path = None
        else:
            _path = Path(path)


def cpu_library() -> Optional[_Library]:
    """The library, looked for once per file (on every attention call this is one dict
    lookup); None when there is no file (or it does not load: one warning), then the SDPA
    path."""
    path = _path
    if path is None:
        return None
    if path not in _loaded:
        with _lock:
            if path not in _loaded:
                _loaded[path] = _load(path)
    return _loaded[path]


def _load(path: Path) -> Optional[_Library]:
    if not path.is_file():
        return None
    try:
        return _Library(path)
    except (OSError, AttributeError) as exc:
        warnings.warn(f"{path}: not usable ({exc}); iRPE attention on CPU takes the SDPA path",
                      stacklevel=3)
        return None


def records_grad(*tensors: Tensor) -> bool:
    """Whether autograd records ops on these tensors: then no in-place / out= shortcuts on CPU
    (irpe.fused.cpu) and no native kernel (it has no backward)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def library_supported(q: Tensor, k: Tensor, v: Tensor, rpe_q: Optional[Encoding],
                      rpe_k: Optional[Encoding], rpe_v: Optional[Encoding],
                      key_padding_mask: Optional[Tensor]) -> bool:
    """Whether a CPU call (already past irpe.fused.cpu_supported) can run in the kernel."""
    if key_padding_mask is not None or torch.compiler.is_compiling() or cpu_library() is None:
        return False  # torch.compile traces fake tensors: no pointers to hand to C
    if records_grad(q, k, v):
        return False
    if any(t.dtype != torch.float32 or t.stride(-1) != 1 for t in (q, k, v)):
        return False
    if not (q.shape == k.shape == v.shape and q.stride() == k.stride() == v.stride()):
        return False
    for m in (x for x in (rpe_q, rpe_k, rpe_v) if x is not None):
        if type(m) is not iRPE or m.mode != "contextual" or m.lookup_table_weight.shape[0] != 1:
            return False
        if records_grad(m.lookup_table_weight):
            return False
    return True


def _ids(lib: _Library, m: iRPE, length: int, height: Optional[int], width: Optional[int],
         kind: str) -> Tensor:
    """The kernel's int32 table [L, pad(L)] of a term, cached per method, ratio, grid and
    kind."""
    def build() -> Tensor:
        ids = m.bucket_ids(length, height, width).to(torch.int64)
        if kind == "q":  # bucket-major c * L + j of the term's transposed ids
            ids = ids.t() * length + torch.arange(length).view(1, -1)
        ids = ids.contiguous()
        out = torch.empty(length * lib.pad(length), dtype=torch.int32)
        lib.check(lib.ids(KINDS.index(kind), ids.data_ptr(), length, m.num_buckets,
                          out.data_ptr()), "id table")
        return out

    key = ("cpu_library", kind, m.method, float(m.ratio), m.grid(length, height, width))
    return BUCKET_IDS.get_or_build(key, torch.inference_mode(False)(build))


def _single(m: Optional[Encoding]) -> Optional[iRPE]:
    """``m`` as the single-table encoding the kernel takes (library_supported checks it)."""
    if m is not None and not isinstance(m, iRPE):
        raise TypeError(f"the native iRPE attention kernel takes iRPE encodings, not "
                        f"{type(m).__name__}; library_supported() says when it runs")
    return m


def library_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, rpe_q: Optional[Encoding],
                      rpe_k: Optional[Encoding], rpe_v: Optional[Encoding],
                      height: Optional[int], width: Optional[int]) -> Tensor:
    """rpe_attention's result (B, H, L, D) from the kernel: a (B, L, H, D) buffer seen as
    (B, H, L, D), so the caller's transpose back is free."""
    lib = cpu_library()
    if lib is None:
        raise RuntimeError(f"the native iRPE attention kernel is not loaded ({LIBRARY_FILE}: "
                           f"make ort-ops, or ${ENV}); library_supported() says when it is")
    rpe_q, rpe_k, rpe_v = _single(rpe_q), _single(rpe_k), _single(rpe_v)
    b, h, length, d = q.shape
    out = torch.empty((b, length, h, d), dtype=torch.float32)
    args = _Args(batch=b, heads=h, l=length, d=d, scale=scale, q=q.data_ptr(), k=k.data_ptr(),
                 v=v.data_ptr(), in_stride=(_I64 * 3)(*q.stride()[:3]), out=out.data_ptr(),
                 out_stride=(_I64 * 3)(length * h * d, d, h * d))
    keep = []  # tensors whose pointers are in args, alive until the call returns
    if rpe_k is not None:
        wk = rpe_k.lookup_table_weight[0].detach().contiguous()  # [d, K]; the kernel scales
        idk = _ids(lib, rpe_k, length, height, width, "k")
        args.kk, args.wk, args.idk = rpe_k.num_buckets, wk.data_ptr(), idk.data_ptr()
        keep += [wk, idk]
    if rpe_q is not None:
        wq = (rpe_q.lookup_table_weight[0].detach() * scale).t().contiguous()  # [K, d]
        idq = _ids(lib, rpe_q, length, height, width, "q")
        args.kq, args.wq, args.idq = rpe_q.num_buckets, wq.data_ptr(), idq.data_ptr()
        keep += [wq, idq]
    if rpe_v is not None:
        wv = rpe_v.lookup_table_weight[0].detach().contiguous()  # [K, d]
        idv = _ids(lib, rpe_v, length, height, width, "v")
        args.kv, args.wv, args.idv = rpe_v.num_buckets, wv.data_ptr(), idv.data_ptr()
        keep += [wv, idv]
    lib.check(lib.run(ctypes.byref(args), torch.get_num_threads()), "iRPE attention")
    return out.transpose(1, 2)
