"""The steps of `make gpu-check` (scripts/gpu_check.py): phases, commands, timeouts, needs.

Each step is one child process with its own timeout. Phases are sized so that the whole check
fits in three calls of at most 9 minutes on one H100 (CALLS; docs/gpu-check.md): the timeouts of
a call's steps add up to under its budget, and the budget guard skips what would not fit.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("env", "tests", "probes", "bench")
# call number -> phases; env is seconds long and repeated, so every call's report names its device
CALLS: Dict[int, Tuple[str, ...]] = {1: ("env", "tests"), 2: ("env", "probes"),
                                     3: ("env", "bench")}
PROBE_FILES = ("tests/gpu/test_gpu_defects.py", "tests/gpu/test_fused_variants_gpu.py",
               "tests/gpu/test_ort_cuda_ops.py")  # run by the probes, not again by tests
KERNEL_TESTS = ("tests/gpu/test_cuda_ops.py", "tests/gpu/test_fused_attention_gpu.py")
SERVING_TESTS = ("tests/gpu/test_serve_cuda.py",)
# headers a bare machine lacks, carried in the ignored .third_party/ (docs/gpu-check.md)
CARRIED_ROOTS = {"TENSORRT_ROOT": "tensorrt-*", "ORT_ROOT": "onnxruntime-*"}


@dataclass(frozen=True)
class Step:
    """One command of the check. ``needs``: "cuda" (a CUDA device), "serving" (fastapi,
    pydantic, uvicorn importable), "ort-cuda" (onnxruntime with CUDAExecutionProvider); a
    step whose needs are missing is skipped with the reason. ``dry``: runs under --dry-run."""

    phase: str
    name: str
    what: str
    argv: Tuple[str, ...]
    timeout_s: int
    needs: Tuple[str, ...] = ()
    pytest: bool = False
    dry: bool = False
    env: Dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.name}"


def _pytest(*args: str) -> Tuple[str, ...]:
    return (sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *args)


def _bench(*args: str) -> Tuple[str, ...]:
    return (sys.executable, "-m", "irpe", "bench", *args)


def plan(out: Path, arch: str = "90") -> List[Step]:
    """Every step in order; ``out`` is the results folder (the benchmarks write there too),
    ``arch`` the CUDA architecture to build the ORT library for (e.g. 90 on an H100)."""
    o = str(out)
    ignore = [f"--ignore={p}" for p in PROBE_FILES + KERNEL_TESTS + SERVING_TESTS]
    return [
        Step("env", "versions", "device, driver, CUDA, torch, triton, serving stack, nvcc",
             (), 60, dry=True),
        Step("env", "collect", "tests/gpu collects with 0 errors (the serving stack optional)",
             _pytest("--collect-only", "tests/gpu"), 120, dry=True),
        Step("env", "variants", "the fused kernels' variant families (irpe.fused.variants)",
             (sys.executable, "-c", "import irpe.fused.variants as f; "
              "print(*(v.name for v in f.variants()))"), 60, dry=True),
        Step("tests", "kernels", "CUDA ops (JIT build) and fused attention vs unfused",
             _pytest(*KERNEL_TESTS), 230, ("cuda",), pytest=True),
        Step("tests", "serving", "serving on CUDA: fp16 check, graphs, nvJPEG, bench rows",
             _pytest(*SERVING_TESTS), 130, ("cuda",), pytest=True),
        Step("tests", "rest", "the rest of tests/gpu (TensorRT plugin engines and harness, ...)",
             _pytest("tests/gpu", *ignore), 140, ("cuda",), pytest=True),
        Step("probes", "graphs-eviction", "CUDA-graph replay after bucket-id eviction == eager",
             _pytest(PROBE_FILES[0], "-k", "eviction"), 90, ("cuda",), pytest=True),
        Step("probes", "graphs-concurrent", "two graph owners / served instances capture "
             "concurrently, replay == eager", _pytest(PROBE_FILES[0], "-k", "concurrently or "
                                                     "instances"), 120, ("cuda",), pytest=True),
        Step("probes", "nvjpeg-busy-stream", "nvJPEG batch under a busy default stream == PIL",
             _pytest(PROBE_FILES[0], "-k", "nvjpeg"), 90, ("cuda", "serving"), pytest=True),
        Step("probes", "triton-variants", "one launch per fused-kernel variant (names it)",
             _pytest(PROBE_FILES[1]), 180, ("cuda",), pytest=True),
        Step("probes", "ort-cuda-build", "libirpe_ort_ops_cuda.so for this GPU (plugins/build.sh)",
             ("bash", "plugins/build.sh", "build/plugins", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"),
             150, ("cuda", "ort-cuda")),
        Step("probes", "ort-cuda-ep", "the custom ops on ORT's CUDA EP vs the CPU EP and torch",
             _pytest(PROBE_FILES[2]), 60, ("cuda", "ort-cuda"), pytest=True),
        Step("bench", "attention", "fused iRPE attention vs unfused vs SDPA (layers, models)",
             _bench("attention", "--rounds", "3", "--iters", "10", "--out", o), 170, ("cuda",)),
        Step("bench", "models", "DeiT-Ti/S plain vs iRPE, eager vs CUDA graphs, fp32/fp16, bs "
             "1 and 64 (no torch.compile: minutes per build)",
             _bench("models", "--device", "cuda", "--models", "deit_tiny,deit_small",
                    "--backends", "eager,cudagraph", "--precisions", "fp32,fp16",
                    "--batches", "1,64", "--repeats", "5", "--out", o), 170, ("cuda",)),
        Step("bench", "ops", "iRPE gather/scatter kernels vs torch (quick grid)",
             _bench("ops", "--quick", "--out", o), 90, ("cuda",)),
        Step("bench", "serve", "HTTP load on `irpe serve` (torch on CUDA, JPEG, quick)",
             _bench("serve", "--quick", "--backend", "torch", "--device", "cuda", "--out", o),
             90, ("cuda", "serving")),
    ]


def select(steps: List[Step], phases: Tuple[str, ...]) -> List[Step]:
    """The steps of ``phases``, in plan order."""
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise ValueError(f"unknown phase {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    return [s for s in steps if s.phase in phases]
