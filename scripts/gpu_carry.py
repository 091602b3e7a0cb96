#!/usr/bin/env python3
"""`make gpu-carry`: prepare what must travel with the checkout to a lent GPU machine for
`make gpu-check` (docs/gpu-check.md), in folders git ignores, and print their sizes.

    python scripts/gpu_carry.py [--shared DIR] [--no-cmake] [--no-wheels] [--no-prebuilt]

- .whl/: the Python 3.12 manylinux wheels of the serving stack the GPU image lacks (the logic
  of ../shared/gpu/fetch-wheels.sh: one version of each, pinned to this interpreter's where it
  has the package), plus cmake's (the plugin harness's fallback build; --no-cmake leaves it
  out). Wheels already in .whl/ at the wanted version are not downloaded again.
- .third_party/: the TensorRT and ONNX Runtime headers of DIR/third_party (the plugin harness,
  the ORT CUDA library).
- .gpu-prebuilt/trt-harness/<key>/: the TensorRT plugin harness and plugin libraries built here
  for sm_90 (nvcc, no GPU needed), so the GPU machine's harness test builds nothing.

Exit status 1 when the carry exceeds CARRY_LIMIT_MIB or, with the tracked tree, the transfer
limit (scripts/gpu_check_steps.py). What cannot be prepared here: the CUDA ops' JIT build
(torch.utils.cpp_extension against the GPU image's torch 2.11+cu130 / Python 3.12, neither of
which is here) and Triton's compiles (keyed by the GPU's driver-side specialisation): both are
cached under /tmp on the warm machine instead (gpu_check_steps.CACHE_DIRS).
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_steps import HARNESS_BUILD, PREBUILT, ROOT, carry_lines  # noqa: E402

# What the lent GPU machine's image has installed (../shared/gpu/README.md, 2026-11-23/25), each
# with the packages it requires; tests/test_gpu_image.py emulates it to check SERVING.
GPU_IMAGE = ("torch", "triton", "torchvision", "timm", "numpy", "onnx", "onnxruntime", "pillow",
             "scipy", "pyyaml", "prometheus-client", "httpx", "matplotlib", "click", "h11",
             "anyio", "annotated-doc", "pytest", "hypothesis",
             # timm's requirements and huggingface-hub's (neither is installed here to tell)
             "safetensors", "huggingface-hub", "tqdm", "requests", "filelock", "fsspec")
# what `irpe serve` needs beyond the GPU image (as ../shared/gpu/fetch-wheels.sh, plus the /docs
# assets and the /v2 JSON parser added since), downloaded without their dependencies: so the
# list must be closed under them (tests/test_gpu_image.py)
SERVING = ("fastapi", "starlette", "pydantic", "pydantic-core", "pydantic-settings",
           "python-dotenv", "uvicorn", "python-multipart", "annotated-types", "annotated-doc",
           "typing-inspection", "typing-extensions", "opentelemetry-api", "click", "h11", "anyio",
           "fastapi-offline", "pysimdjson")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")
HEADERS = ("tensorrt-*", "onnxruntime-*")
ARCH = "90"  # H100 / H200, the lent machines


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _have(folder: Path, name: str, version: Optional[str]) -> List[Path]:
    """Wheels of ``name`` in ``folder`` (any version when ``version`` is None)."""
    out = []
    for wheel in folder.glob("*.whl"):
        dist, ver = wheel.name.split("-")[:2]
        if _norm(dist) == _norm(name) and (version is None or ver == version):
            out.append(wheel)
    return out


def wheels(folder: Path, cmake: bool) -> None:
    """Download the wheels not yet in ``folder`` (one version of each; older ones removed)."""
    folder.mkdir(exist_ok=True)
    wanted = {}
    for name in SERVING + (("cmake",) if cmake else ()):
        try:
            wanted[name] = md.version(name)
        except md.PackageNotFoundError:
            wanted[name] = None
    todo = []
    for name, version in wanted.items():
        if _have(folder, name, version):
            continue
        for stale in _have(folder, name, None):
            stale.unlink()
        todo.append(f"{name}=={version}" if version else name)
    if not cmake:
        for stale in _have(folder, "cmake", None):
            stale.unlink()
    if todo:
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--python-version", "3.12", "--implementation", "cp",
                *(f"--platform={p}" for p in PLATFORMS), "-d", str(folder), *todo]
        print(f"gpu-carry: pip download {' '.join(todo)}", flush=True)
        subprocess.run(argv, check=True)
    print(f"gpu-carry: .whl/ {len(list(folder.glob('*.whl')))} wheels")


def headers(shared: Path, folder: Path) -> None:
    """Copy the header folders of SHARED/third_party into ``folder``."""
    found = [p for pattern in HEADERS for p in sorted((shared / "third_party").glob(pattern))]
    if not found:
        raise SystemExit(f"gpu-carry: no {' / '.join(HEADERS)} in {shared / 'third_party'} "
                         "(give --shared DIR)")
    folder.mkdir(exist_ok=True)
    for src in found:
        dest = folder / src.name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest)
    print(f"gpu-carry: .third_party/ {', '.join(p.name for p in found)}")


def prebuilt(folder: Path, header_root: Path) -> None:
    """Build the plugin harness for sm_90 (or reuse build/test-trt-harness's) and keep only
    the files a run needs; older keys are removed."""
    from tests.trt_harness import cases
    include = header_root / "include"
    build = cases.build(ROOT / HARNESS_BUILD, ARCH, include)
    key = cases.build_folder(ROOT / HARNESS_BUILD, ARCH, include).name
    target = folder / "trt-harness"
    if target.exists():
        shutil.rmtree(target)
    source = ROOT / HARNESS_BUILD / key
    for name, path in cases.artifacts(source).items():
        dest = target / key / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build[name], dest)
    print(f"gpu-carry: .gpu-prebuilt/trt-harness/{key} (sm_{ARCH}; built in "
          f"{build['seconds']:.0f} s)")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_carry", description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared",
                   help="folder with third_party/ (default ../shared)")
    p.add_argument("--no-cmake", action="store_true", help="leave the cmake wheel out")
    p.add_argument("--no-wheels", action="store_true", help="leave .whl/ as it is")
    p.add_argument("--no-prebuilt", action="store_true", help="leave .gpu-prebuilt/ as it is")
    args = p.parse_args(argv)
    shared = args.shared if (args.shared / "third_party").is_dir() else Path("/work/shared")
    if not args.no_wheels:
        wheels(ROOT / ".whl", not args.no_cmake)
    headers(shared, ROOT / ".third_party")
    if not args.no_prebuilt:
        trt = sorted((ROOT / ".third_party").glob("tensorrt-*"))
        prebuilt(ROOT / PREBUILT, trt[-1])
    lines, problems = carry_lines()
    for line in lines:
        print(f"gpu-carry: {line}")
    print("gpu-carry: device tool: carry [\".whl\", \".third_party\", \".gpu-prebuilt\"]")
    for problem in problems:
        print(f"gpu-carry: TOO BIG: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
