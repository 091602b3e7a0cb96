"""ctypes view of the kernels' C ABI (plugins/kernels/irpe_kernels.h), and how to build it.

A test and benchmark aid, never imported by the product: :func:`build_host_library` compiles only
the bucket math (bucket_host.c, no CUDA) with the host C compiler, :func:`build_kernels_library`
compiles the CUDA kernels with nvcc into a shared library. :class:`KernelLibrary` loads either and
wraps the entry points.
"""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Iterable, Sequence, Union

import torch

from irpe.bucket import parse_method
from plugins.kernel_sources import CUDA_SOURCES, KERNEL_DIR, METHOD_IDS, nvcc_path

__all__ = ["KERNEL_DIR", "CUDA_SOURCES", "ARCHS", "METHOD_IDS", "BucketParams", "Problem",
           "KernelLibrary", "KernelError", "nvcc_path", "gencode_flags", "build_host_library",
           "build_kernels_library"]

# Machine code for Turing .. Hopper plus compute_90 PTX (CUDA 13 has nothing below sm_75).
ARCHS = ("75", "80", "86", "89", "90")
STATUS = {0: "ok", 1: "invalid argument", 2: "CUDA error"}
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
INDEX_DTYPES = {torch.int32: 0, torch.int64: 1}


class KernelError(RuntimeError):
    """A kernels-library call returned a status other than IRPE_OK."""


class BucketParams(ctypes.Structure):
    """irpe_bucket_params."""
    _fields_ = [(name, ctypes.c_int32) for name in
                ("method", "height", "width", "skip", "beta_int", "extra", "num_buckets")] + \
               [(name, ctypes.c_float) for name in ("alpha", "beta", "log_ratio", "span")]


class Problem(ctypes.Structure):
    """irpe_problem: sizes and the element strides of the 4-D input."""
    _fields_ = [(name, ctypes.c_int64)
                for name in ("batch", "heads", "lq", "lk", "num_buckets")] + \
               [("stride", ctypes.c_int64 * 4)]


def _ptr(x) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.data_ptr() if isinstance(x, torch.Tensor) else x)


class KernelLibrary:
    """A loaded libirpe_kernels (or the host-only library, which has just the bucket math)."""

    def __init__(self, path: Union[str, Path]):
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.irpe_make_bucket_params.argtypes = [
            ctypes.POINTER(BucketParams), ctypes.c_int, ctypes.c_double, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_int64]
        self.lib.irpe_bucket_ids_host.argtypes = [ctypes.POINTER(BucketParams), ctypes.c_void_p]
        if hasattr(self.lib, "irpe_last_error"):
            self.lib.irpe_last_error.restype = ctypes.c_char_p

    def device_count(self) -> int:
        """CUDA devices this library sees; -1 when the driver/runtime reports an error."""
        return self.lib.irpe_device_count()

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            detail = STATUS.get(status, f"status {status}")
            if status == 2 and hasattr(self.lib, "irpe_last_error"):
                detail += ": " + self.lib.irpe_last_error().decode()
            raise KernelError(f"{what}: {detail}")

    def make_params(self, method, ratio: float, height: int, width: int,
                    skip: int = 0) -> BucketParams:
        """irpe_make_bucket_params; ValueError for cross (two maps) or bad sizes."""
        m = parse_method(method)
        if m not in METHOD_IDS:
            raise ValueError(f"method {m.value!r} has no single bucket map; use cross_rows/cols")
        params = BucketParams()
        status = self.lib.irpe_make_bucket_params(ctypes.byref(params), METHOD_IDS[m],
                                                  float(ratio), height, width, skip)
        if status != 0:
            raise ValueError(f"invalid bucket parameters: method={m.value} ratio={ratio} "
                             f"grid={height}x{width} skip={skip}")
        return params

    def bucket_ids_host(self, params: BucketParams) -> torch.Tensor:
        """The (skip+H*W)^2 int32 id table computed by the C code on the CPU."""
        n = params.skip + params.height * params.width
        out = torch.empty((n, n), dtype=torch.int32)
        self._check(self.lib.irpe_bucket_ids_host(ctypes.byref(params), _ptr(out)),
                    "irpe_bucket_ids_host")
        return out

    def call(self, name: str, *args) -> int:
        """Raw call of a kernel entry point with ctypes-ready arguments; returns the status."""
        return getattr(self.lib, name)(*args)


def gencode_flags(archs: Sequence[str] = ARCHS) -> list:
    """-gencode flags: machine code for each arch, PTX for the newest one too."""
    flags = []
    for arch in archs:
        code = f"[sm_{arch},compute_{arch}]" if arch == archs[-1] else f"sm_{arch}"
        flags += ["-gencode", f"arch=compute_{arch},code={code}"]
    return flags


def _run(cmd: Iterable[str], cwd: Path) -> str:
    """Run a compiler; its stdout + stderr, or KernelError with the tail of its errors."""
    cmd = list(cmd)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def build_host_library(out_dir: Union[str, Path], compiler: str = "gcc") -> Path:
    """bucket_host.c -> libirpe_bucket_host.so (no FMA contraction, like the official math)."""
    out = Path(out_dir) / "libirpe_bucket_host.so"
    _run([compiler, "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Werror", "-shared",
          "-fPIC", f"-I{KERNEL_DIR}", str(KERNEL_DIR / "bucket_host.c"), "-o", str(out), "-lm"],
         Path(out_dir))
    return out


def build_kernels_library(out_dir: Union[str, Path], archs: Sequence[str] = ARCHS,
                          nvcc: str | None = None) -> tuple:
    """Every kernel for every arch in ONE nvcc call, then linked with bucket_host.c.

    Returns (library path, compile log); the log has ptxas' per-architecture resource lines.
    """
    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        raise KernelError("nvcc not found (set CUDACXX or put the CUDA toolkit on PATH)")
    out_dir = Path(out_dir)
    log = _run([nvcc, "-std=c++17", "-O3", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall",
                "--resource-usage", "--threads", "0", *gencode_flags(archs), f"-I{KERNEL_DIR}",
                "-c", *[str(KERNEL_DIR / s) for s in CUDA_SOURCES], "-odir", str(out_dir)],
               out_dir)
    objects = [str(out_dir / (Path(s).stem + ".o")) for s in CUDA_SOURCES]
    lib = out_dir / "libirpe_kernels.so"
    # cudart linked statically: the library loads without any CUDA runtime on the library path
    _run([nvcc, "-shared", "-cudart", "static", *objects, str(KERNEL_DIR / "bucket_host.c"),
          "-Xcompiler", "-fPIC,-ffp-contract=off,-Wall,-Werror", f"-I{KERNEL_DIR}",
          "-o", str(lib)], out_dir)
    return lib, log
