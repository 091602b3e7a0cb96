"""Where the CUDA kernel sources live, which ones make the library, their method ids, and nvcc.

Shared by the PyTorch loader (plugins/pytorch) and the build and inspection aids in tools/,
so the source list and the C ABI's method ids are written once.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from irpe import bucket
from irpe.bucket import Method

__all__ = ["KERNEL_DIR", "CUDA_SOURCES", "METHOD_IDS", "nvcc_path"]

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
CUDA_SOURCES = ("common.cu", "gather.cu", "scatter.cu")
# IRPE_METHOD_* of irpe_bucket.h: the official ids of the methods with one bucket map (cross is
# its rows and cols maps)
METHOD_IDS = {m: number for m, number in bucket.METHOD_IDS.items() if m is not Method.CROSS}


def nvcc_path() -> str | None:
    """nvcc from CUDACXX, PATH or /usr/local/cuda, or None."""
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"),
                      "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None
