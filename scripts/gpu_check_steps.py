"""The steps of `make gpu-check` (scripts/gpu_check.py): tiers, commands, timeouts, needs, and the
arithmetic that fits them into one lent-GPU call (docs/gpu-check.md).

A lent machine has 15 minutes of device time in all (its start, every call, idle waits). The plan
is one call of at most CALL_WALL_S: the steps run in order of value (env -> correct -> bench ->
rest), each a child process under its own timeout, and the timeouts of the WINDOW tiers add up to
at most BUDGET_S, so they run whole even if every one of them takes its full timeout. The rest
tier runs on what is left and, when cut, in a short second call that resumes the same report.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("env", "correct", "bench", "rest")  # the tiers, in order of value
WINDOW = ("env", "correct", "bench")          # must fit BUDGET_S by their timeouts

# The budget arithmetic (seconds; H100, device tool of 2026-11-28). Device time: DEVICE_S in all;
# the machine start counts (1-2 minutes) and no machine starts with under 4 minutes left.
DEVICE_S = 15 * 60
MACHINE_START_S = 120  # a start, at worst
CALL_WALL_S = 8 * 60   # the first call's wall-clock limit
BUDGET_S = 450         # the steps' share of it (--budget); the budget guard enforces it
OVERHEAD_S = 30        # Python + make start, the report, a timed-out step's SIGINT grace
IDLE_S = 30            # transfers and the wait between two calls
SECOND_CALL_WALL_S = DEVICE_S - MACHINE_START_S - CALL_WALL_S - IDLE_S  # 270: resume call
SECOND_BUDGET_S = SECOND_CALL_WALL_S - OVERHEAD_S - IDLE_S             # 210

# What must travel with the checkout (make gpu-carry; ignored by git): the transfer holds
# TRANSFER_LIMIT_MIB in all, tree included; the carry itself is kept under CARRY_LIMIT_MIB.
CARRY_DIRS = (".whl", ".third_party", ".gpu-prebuilt")
CARRY_LIMIT_MIB = 60
TRANSFER_LIMIT_MIB = 64
# headers a bare machine lacks, carried in the ignored .third_party/
CARRIED_ROOTS = {"TENSORRT_ROOT": "tensorrt-*", "ORT_ROOT": "onnxruntime-*"}
# caches that persist on the warm machine between calls (/tmp survives while it is held): one
# JIT build of the CUDA ops and one Triton compile per kernel variant serve every later step
CACHE_DIRS = {"TORCH_EXTENSIONS_DIR": "irpe_torch_ext", "TRITON_CACHE_DIR": "irpe_triton_cache"}
HARNESS_BUILD = Path("build") / "test-trt-harness"  # tests/gpu/test_trt_plugin_harness_gpu.py
PREBUILT = Path(".gpu-prebuilt")

KERNEL_TESTS = "tests/gpu/test_cuda_ops.py"
FUSED_TESTS = "tests/gpu/test_fused_attention_gpu.py"
HARNESS_TESTS = "tests/gpu/test_trt_plugin_harness_gpu.py"
DEFECT_TESTS = "tests/gpu/test_gpu_defects.py"
VARIANT_TESTS = "tests/gpu/test_fused_variants_gpu.py"
SERVING_TESTS = "tests/gpu/test_serve_cuda.py"
ORT_TESTS = "tests/gpu/test_ort_cuda_ops.py"
NAMED_TESTS = (KERNEL_TESTS, FUSED_TESTS, HARNESS_TESTS, DEFECT_TESTS, VARIANT_TESTS,
               SERVING_TESTS, ORT_TESTS)  # rest/others runs every other file of tests/gpu
FUSED_CORE = "not compile and not dtype1 and not dtype2"  # fp16 (dtype0) and the goals
FUSED_REST = "compile or dtype1 or dtype2"                 # bf16, fp32, torch.compile
ORT_GPU_WHY = ("onnxruntime has no CUDAExecutionProvider: onnxruntime-gpu (a 255 MB wheel) "
               "cannot travel to a lent machine; run this step on your own GPU machine")


@dataclass(frozen=True)
class Step:
    """One command of the check. ``needs``: "cuda" (a CUDA device), "serving" (fastapi,
    pydantic, uvicorn importable), "ort-cuda" (onnxruntime with CUDAExecutionProvider); a
    step whose needs are missing is skipped with the reason. ``dry``: runs under --dry-run.
    ``setup``: runs in every call (cheap, idempotent) and is never resumed past. Steps without
    ``argv`` run inside gpu_check itself."""

    phase: str
    name: str
    what: str
    argv: Tuple[str, ...]
    timeout_s: int
    needs: Tuple[str, ...] = ()
    pytest: bool = False
    dry: bool = False
    setup: bool = False
    env: Dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.name}"


def _pytest(*args: str) -> Tuple[str, ...]:
    return (sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *args)


def _bench(*args: str) -> Tuple[str, ...]:
    return (sys.executable, "-m", "irpe", "bench", *args)


def plan(out: Path, arch: str = "90") -> List[Step]:
    """Every step in order of value; ``out`` is the results folder (the benchmarks write there
    too), ``arch`` the CUDA architecture to build the ORT library for (e.g. 90 on an H100).
    Timeouts: guesses from the 2026-11-23 H100 run (test_cuda_ops.py, 85 tests incl. the JIT
    build: 53 s); each run's report gives every step's measured seconds to re-size them."""
    o = str(out)
    ignore = [f"--ignore={p}" for p in NAMED_TESTS]
    return [
        Step("env", "wheels", "serving-stack wheels of .whl/ into --site (pip --no-index)",
             (), 20, setup=True),
        Step("env", "prebuilt", "prebuilt artifacts of .gpu-prebuilt/ (sm_90 plugin harness) "
             "checked with ldd, put in build/", (), 5, setup=True),
        Step("env", "versions", "device, driver, CUDA, torch, triton, serving stack, nvcc",
             (), 10, dry=True, setup=True),
        Step("env", "variants", "the fused kernels' variant families (tools.fused_variants)",
             (), 5, dry=True, setup=True),
        Step("env", "collect", "tests/gpu collects with 0 errors (the serving stack optional)",
             _pytest("--collect-only", "tests/gpu"), 25, dry=True),
        Step("correct", "cuda-ops", "CUDA ops (one JIT build, cached) vs the CPU reference",
             _pytest(KERNEL_TESTS), 80, ("cuda",), pytest=True),
        Step("correct", "fused-attention", "fused attention vs unfused: fp16 layers at DeiT and "
             "DETR sizes, logits goals, backward, graph capture", _pytest(FUSED_TESTS, "-k",
                                                                         FUSED_CORE),
             75, ("cuda",), pytest=True),
        Step("correct", "trt-harness", "TensorRT plugin libraries through enqueue on the GPU "
             "(harness, no TensorRT) == irpe.ops", _pytest(HARNESS_TESTS), 40, ("cuda",),
             pytest=True),
        Step("correct", "defects", "graph replay after bucket-id eviction, concurrent captures, "
             "two served instances, nvJPEG under a busy stream == eager / PIL",
             _pytest(DEFECT_TESTS), 40, ("cuda",), pytest=True),
        Step("correct", "variants", "one launch per fused-kernel variant family (fp16; names it)",
             _pytest(VARIANT_TESTS, "-k", "fp16"), 45, ("cuda",), pytest=True),
        Step("bench", "attention", "fused iRPE-K/QKV vs unfused vs SDPA (FlashAttention) layers: "
             "DeiT-S bs64, DETR L950/2150/4800, fp16",
             _bench("attention", "--parts", "layers", "--terms", "k,qkv", "--rounds", "3",
                    "--iters", "10", "--warmup", "2", "--out", o), 40, ("cuda",)),
        Step("bench", "models", "DeiT-S bs64 fp16 eager: plain, iRPE-K, iRPE-QKV, timm's plain",
             _bench("models", "--device", "cuda", "--models", "deit_small", "--variants",
                    "plain,irpe_k,irpe_qkv,timm", "--backends", "eager", "--precisions", "fp16",
                    "--batches", "64", "--repeats", "5", "--warmup", "2", "--out", o), 30,
             ("cuda",)),
        Step("bench", "serve", "one quick HTTP row: `irpe serve` torch on CUDA, JPEG, 8 clients",
             _bench("serve", "--quick", "--backend", "torch", "--device", "cuda",
                    "--concurrency", "8", "--images-per-request", "1", "--out", o), 30,
             ("cuda", "serving")),
        Step("rest", "variants", "one launch per variant family in bf16 and fp32",
             _pytest(VARIANT_TESTS, "-k", "not fp16"), 60, ("cuda",), pytest=True),
        Step("rest", "serving", "serving on CUDA: fp16 check, graphs, nvJPEG, bench rows",
             _pytest(SERVING_TESTS), 90, ("cuda",), pytest=True),
        Step("rest", "others", "the rest of tests/gpu (TensorRT engines, new files)",
             _pytest("tests/gpu", *ignore), 30, ("cuda",), pytest=True),
        Step("rest", "fused-attention", "fused attention: bf16/fp32 layers, torch.compile + "
             "CUDA-graph replay", _pytest(FUSED_TESTS, "-k", FUSED_REST), 120,
             ("cuda",), pytest=True),
        Step("rest", "bench-ops", "iRPE gather/scatter kernels vs torch (quick grid; reuses the "
             "JIT build)", _bench("ops", "--quick", "--out", o), 60, ("cuda",)),
        Step("rest", "bench-models", "whole models fused vs unfused: DeiT-S K/QK/QKV bs64, "
             "DETR-R50 800x1216 / 1344x2016", _bench("attention", "--parts", "models",
                                                     "--rounds", "3", "--iters", "5",
                                                     "--tag", "models", "--out", o),
             90, ("cuda",)),
        Step("rest", "ort-cuda-build", "libirpe_ort_ops_cuda.so for this GPU (plugins/build.sh)",
             ("bash", "plugins/build.sh", "build/plugins", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"),
             150, ("cuda", "ort-cuda")),
        Step("rest", "ort-cuda-ep", "the custom ops on ORT's CUDA EP vs the CPU EP and torch",
             _pytest(ORT_TESTS), 60, ("cuda", "ort-cuda"), pytest=True),
    ]


def select(steps: List[Step], phases: Tuple[str, ...]) -> List[Step]:
    """The steps of ``phases``, in plan order."""
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise ValueError(f"unknown phase {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    return [s for s in steps if s.phase in phases]


def window_seconds(steps: Sequence[Step]) -> int:
    """Sum of the timeouts of the WINDOW tiers: the first call's worst case."""
    return sum(s.timeout_s for s in steps if s.phase in WINDOW)


def _fits(ok: bool) -> str:
    return "fits" if ok else "DOES NOT FIT"


def budget_lines(steps: Sequence[Step], budget: float) -> Tuple[List[str], List[str]]:
    """(the budget arithmetic as printed lines, the problems: the window does not fit)."""
    tiers = {p: sum(s.timeout_s for s in steps if s.phase == p) for p in PHASES}
    window = window_seconds(steps)
    call = budget + OVERHEAD_S
    rest = [s for s in steps if s.phase not in WINDOW and "ort-cuda" not in s.needs]
    ort = sum(s.timeout_s for s in steps if "ort-cuda" in s.needs)
    second, used = [], 0
    for s in rest:  # what a second call takes whole, in order, when call 1 left nothing
        if used + s.timeout_s > SECOND_BUDGET_S:
            break
        second.append(s.key)
        used += s.timeout_s
    lines = [f"budget: device time {DEVICE_S} s = machine start <= {MACHINE_START_S} s + "
             f"call 1 <= {CALL_WALL_S} s wall + {IDLE_S} s transfers/idle + call 2 <= "
             f"{SECOND_CALL_WALL_S} s wall",
             f"call 1: step budget {budget:.0f} s + {OVERHEAD_S} s start-up/report = "
             f"{call:.0f} s <= {CALL_WALL_S} s wall: {_fits(call <= CALL_WALL_S)}",
             "call 1 window by timeouts: " + " + ".join(f"{p} {tiers[p]}" for p in WINDOW)
             + f" = {window} s <= {budget:.0f} s budget: {_fits(window <= budget)}",
             f"rest: {sum(s.timeout_s for s in rest)} s of timeouts (+ {ort} s of ort-cuda steps "
             f"for a machine with onnxruntime-gpu), on call 1's time left, then call 2 "
             f"(--budget {SECOND_BUDGET_S}: {', '.join(second) or 'nothing'} whole "
             f"({used} s), the rest as time allows); what is left waits for the next window"]
    problems = []
    if window > budget:
        problems.append(f"the window's timeouts ({window} s) exceed the budget ({budget:.0f} s)")
    if call > CALL_WALL_S:
        problems.append(f"budget {budget:.0f} s + {OVERHEAD_S} s exceeds the call's "
                        f"{CALL_WALL_S} s")
    return lines, problems


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def tree_bytes(root: Path = ROOT) -> Optional[int]:
    """Bytes of the files git tracks (what the device tool copies besides the carry), or None
    without git."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True,
                               timeout=30, check=True).stdout.split(b"\0")
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(os.path.getsize(root / n.decode()) for n in names
               if n and (root / n.decode()).is_file())


def carry_lines(root: Path = ROOT) -> Tuple[List[str], List[str]]:
    """(the carry's sizes as printed lines, the problems: over a limit)."""
    present = [d for d in CARRY_DIRS if (root / d).is_dir()]
    if not present:
        return [f"carry: not prepared ({', '.join(CARRY_DIRS)} absent; make gpu-carry)"], []
    mib = {d: folder_bytes(root / d) / 2**20 for d in present}
    carry = sum(mib.values())
    lines = ["carry: " + " + ".join(f"{d} {m:.1f}" for d, m in mib.items())
             + f" = {carry:.1f} MiB <= {CARRY_LIMIT_MIB} MiB: {_fits(carry <= CARRY_LIMIT_MIB)}"]
    problems = [f"the carry ({carry:.1f} MiB) exceeds {CARRY_LIMIT_MIB} MiB"] \
        if carry > CARRY_LIMIT_MIB else []
    tree = tree_bytes(root)
    if tree is None:
        lines.append("transfer: the tracked tree's size is unknown (no git)")
    else:
        total = carry + tree / 2**20
        lines.append(f"transfer: tracked tree {tree / 2**20:.1f} MiB + carry {carry:.1f} MiB = "
                     f"{total:.1f} MiB <= {TRANSFER_LIMIT_MIB} MiB: "
                     f"{_fits(total <= TRANSFER_LIMIT_MIB)}")
        if total > TRANSFER_LIMIT_MIB:
            problems.append(f"tree + carry ({total:.1f} MiB) exceed {TRANSFER_LIMIT_MIB} MiB")
    return lines, problems


FINGERPRINT_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".txt", ".sh",
                        ".toml", ".yaml", ".yml", ".cfg", ".ini")
FINGERPRINT_SKIP = {".git", ".venv", "build", "results", ".whl", ".third_party", ".gpu-prebuilt",
                    "__pycache__", ".pytest_cache", ".hypothesis", ".schemathesis", "docs",
                    "node_modules", "dist", "wheelhouse"}


def fingerprint(root: Path = ROOT) -> str:
    """A hash of the checkout's code (sources, tests, configs; not docs, results or builds): a
    report is resumed only by a run of the same code. Needs no git (a copied tree has none)."""
    digest = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in FINGERPRINT_SKIP
                         and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith(FINGERPRINT_SUFFIXES) or name == "Makefile":
                path = Path(dirpath) / name
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
