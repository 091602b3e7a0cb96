"""Find TensorRT C++ headers and build the plugin library with CMake (tests, CI, scripts).

A build aid outside the wheel, never imported by the product.

Headers, in order: ``TENSORRT_ROOT`` (an install), the CI copy of the public 11.1 headers at
``../shared/third_party/tensorrt-11.1`` beside the checkout, the NGC image's system folder.
The runtime library to link is TensorRT-RTX's ``libtensorrt_rtx.so.1`` from its wheel, or a
TensorRT install's ``libnvinfer``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

from irpe.runtime.tensorrt.common import library_dir

__all__ = ["find_headers", "cuda_include", "rtx_library_dir", "tensorrt_library_dir",
           "build_plugins", "unavailable_reason", "CI_HEADERS"]

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"
CI_HEADERS = ROOT.parent / "shared" / "third_party" / "tensorrt-11.1"
SYSTEM_HEADERS = Path("/usr/include/x86_64-linux-gnu")


def find_headers() -> Optional[Path]:
    """Folder holding NvInferRuntime.h, or None."""
    env = os.environ.get("TENSORRT_ROOT")
    for root in ([Path(env) / "include"] if env else []) + [CI_HEADERS / "include",
                                                              SYSTEM_HEADERS]:
        if (root / "NvInferRuntime.h").is_file():
            return root
    return None


def cuda_include() -> Path:
    """CUDA headers (cuda_runtime_api.h, which the TensorRT headers include) beside nvcc."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             str(Path(os.path.realpath(nvcc)).parents[1]), "/usr/local/cuda"]
    for root in filter(None, roots):
        if (Path(root) / "include" / "cuda_runtime_api.h").is_file():
            return Path(root) / "include"
    return Path("/usr/local/cuda/include")


def rtx_library_dir() -> Optional[Path]:
    """Folder of the TensorRT-RTX wheel's libtensorrt_rtx.so.1, or None."""
    return library_dir("libtensorrt_rtx.so.1", ("tensorrt_rtx_libs",))


def tensorrt_library_dir() -> Optional[Path]:
    """Folder of full TensorRT's libnvinfer (the tensorrt wheel's or a system install), or None."""
    env = os.environ.get("TENSORRT_ROOT")
    extra = ([Path(env) / "lib"] if env else []) + [Path("/usr/lib/x86_64-linux-gnu"),
                                                    Path("/usr/lib/aarch64-linux-gnu")]
    return library_dir("libnvinfer.so*", ("tensorrt_libs",), extra)


def unavailable_reason(need_runtime: bool = True) -> Optional[str]:
    """Why the plugin cannot be built (and loaded) here, or None."""
    missing = [tool for tool in ("cmake", "g++") if shutil.which(tool) is None]
    if shutil.which("nvcc") is None and not os.path.isfile("/usr/local/cuda/bin/nvcc"):
        missing.append("nvcc")
    if missing:
        return f"{', '.join(missing)} not found"
    if find_headers() is None:
        return (f"no TensorRT C++ headers (TENSORRT_ROOT, {CI_HEADERS} or {SYSTEM_HEADERS})")
    if need_runtime and rtx_library_dir() is None:
        return "TensorRT-RTX wheel (tensorrt-rtx-cu13-libs) not installed"
    return None


def _source_key(extra: Sequence[str]) -> str:
    digest = hashlib.sha256(" ".join(extra).encode())
    for path in sorted(PLUGINS.glob("CMakeLists.txt")) + sorted(PLUGINS.glob("kernels/*")) + \
            sorted(PLUGINS.glob("tensorrt/*.[ch]*")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def build_plugins(build_dir: Path, *, archs: str = "89", runtime: str = "tensorrt_rtx",
                  runtime_major: Optional[int] = None,
                  targets: Sequence[str] = ("irpe_trt_plugins", "irpe_trt_plugins_static",
                                            "irpe_kernels"),
                  ) -> Dict[str, object]:
    """Configure + build for ``runtime`` (tensorrt_rtx or tensorrt = libnvinfer); reuses
    ``build_dir/<source hash>`` when present.

    Returns {"library": path, "seconds": build time (0 when reused), "log": configure+build log}.
    """
    rtx = runtime == "tensorrt_rtx"
    headers, libdir = find_headers(), rtx_library_dir() if rtx else tensorrt_library_dir()
    if headers is None or libdir is None:
        raise RuntimeError(unavailable_reason() or f"TensorRT headers or {runtime} missing")
    args = [f"-DTENSORRT_ROOT={headers.parent}",
            f"-DIRPE_TRT_LIBRARY_NAME={'tensorrt_rtx' if rtx else 'nvinfer'}",
            f"-DTENSORRT_LIBRARY_DIR={libdir}", f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
            "-DIRPE_REQUIRE_TENSORRT=ON"]
    if runtime_major is not None:
        args.append(f"-DIRPE_TRT_RUNTIME_MAJOR={runtime_major}")
    out = Path(build_dir) / _source_key(args + list(targets))
    library = out / f"lib{targets[0]}.so"
    if library.is_file():
        return {"library": library, "seconds": 0.0, "log": ""}
    start, logs = time.perf_counter(), []
    for cmd in (["cmake", "-S", str(PLUGINS), "-B", str(out), *args],
                ["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2),
                 "--target", *targets]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        logs.append(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{logs[-1][-4000:]}")
    return {"library": library, "seconds": time.perf_counter() - start, "log": "\n".join(logs)}
