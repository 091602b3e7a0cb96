"""`irpe bench models`: forward throughput, latency and memory of plain vs iRPE models.

For each (size, batch, backend, precision) every variant of a family (plain, iRPE-K/QK/QKV)
is built and timed round-robin in the same run (ops_common.time_round_robin), so the overhead
ratio vs the plain model is not skewed by drift on a shared machine.

Precision: on CUDA fp16 is ``.half()`` and bf16 ``.to(torch.bfloat16)`` (weights and inputs);
on CPU bf16 runs under autocast (as the landed CPU figures did) and fp16 is not run. Backends:
eager, torch.compile (dynamo reset before each variant), onnxruntime (CPU, fp32) and, on CUDA,
cudagraph (one CUDA graph of the eager forward per batch size). On CUDA the memory columns are
GPU memory (torch.cuda allocator; NVML's device total where pynvml is present).
"""
from __future__ import annotations

import os
import resource
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from benchmarks.ops_common import time_round_robin
from benchmarks.report import latency_ms
from irpe.errors import InvalidInput
from irpe.precision import PRECISIONS, torch_dtype  # noqa: F401 (PRECISIONS: benchmarks.cli)

DEIT = {"plain": "deit_{s}_patch16_224", "irpe_k": "deit_{s}_patch16_224_ctx_product_50_shared_k",
        "irpe_qk": "deit_{s}_patch16_224_ctx_product_50_shared_qk",
        "irpe_qkv": "deit_{s}_patch16_224_ctx_product_50_shared_qkv"}
# variant -> registry name, or (registry name, create_model overrides) for unregistered twins
Entry = Union[str, Tuple[str, Dict]]
FAMILIES: Dict[str, Dict[str, Entry]] = {
    **{f"deit_{s}": {k: v.format(s=s) for k, v in DEIT.items()} for s in ("tiny", "small", "base")},
    "detr_small": {"plain": ("detr_tiny_irpe", {"rpe_config": None}), "irpe_k": "detr_tiny_irpe"},
    "detr_r50": {"plain": "detr_resnet50", "irpe_k": "detr_resnet50_irpe"},
}
# variant "timm" (only when asked for, and timm imports): timm's own plain model of a DeiT
# family, the reference the project's plain model is timed against
TIMM = "timm:"
TIMM_TWINS = {f"deit_{s}": f"deit_{s}_patch16_224" for s in ("tiny", "small", "base")}
VARIANTS = ("plain", "irpe_k", "irpe_qk", "irpe_qkv", "timm")
DETR_SIZES = ((480, 640), (800, 1216))
BACKENDS = ("eager", "compile", "onnxruntime", "cudagraph")

Runner = Callable[[], object]


def entry(value: Entry) -> Tuple[str, Dict]:
    """(registry name, create_model overrides) of a FAMILIES entry."""
    return (value, {}) if isinstance(value, str) else value


def label(value: Entry) -> str:
    """Model column of a row: the registry name (+ overrides)."""
    name, over = entry(value)
    return name + "".join(f" ({k}={v})" for k, v in over.items())


def variants(family: str, only: Optional[Sequence[str]] = None) -> Dict[str, Entry]:
    """Models of ``family`` by variant (missing registry entries are skipped); ``only``: just
    these variants, where "timm" adds timm's plain twin of a DeiT family when timm imports."""
    from irpe.models import list_models
    if family not in FAMILIES:
        raise InvalidInput(f"unknown model family {family!r}; choose from {', '.join(FAMILIES)}")
    known = set(list_models("*"))
    found = {k: v for k, v in FAMILIES[family].items() if entry(v)[0] in known}
    if only is not None and "timm" in only and family in TIMM_TWINS and timm_available():
        found["timm"] = TIMM + TIMM_TWINS[family]
    return {k: v for k, v in found.items() if only is None or k in only}


def timm_available() -> bool:
    """Whether timm imports here (the GPU image has it; the project does not depend on it)."""
    try:
        import timm  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or present but broken
        return False
    return True


def sizes(family: str, quick: bool, detr_sizes: Sequence[Tuple[int, int]] = DETR_SIZES
          ) -> Sequence[Tuple[int, int]]:
    """Input (H, W) per family: DeiT 224x224; DETR ``detr_sizes`` (the first when quick)."""
    if family.startswith("detr"):
        return tuple(detr_sizes)[:1] if quick else tuple(detr_sizes)
    return ((224, 224),)


def rss_mb() -> float:
    """Current resident set size of this process (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _inputs(family: str, batch: int, size: Tuple[int, int], dev: str) -> Tuple[torch.Tensor, ...]:
    x = torch.randn(batch, 3, *size, device=dev)
    if family.startswith("detr"):
        return x, torch.tensor([list(size)] * batch, device=dev)
    return (x,)


def _torch_module(value: Entry, dev: str) -> torch.nn.Module:
    from export.onnx import output_module
    from irpe import randomize_tables
    from irpe.models import create_model, model_info
    name, overrides = entry(value)
    if name.startswith(TIMM):  # timm's own model: random weights, as the others
        import timm
        return output_module(timm.create_model(name[len(TIMM):], pretrained=False).eval(),
                             "classification").to(dev)
    model = randomize_tables(create_model(name, **overrides).eval())
    task = "detection" if model_info(name).family == "detr" else "classification"
    return output_module(model, task).to(dev)


def cast_mode(precision: str, dev: str) -> str:
    """How a precision runs: "none" (fp32), "cast" (weights + float inputs; CUDA) or
    "autocast" (bf16 on CPU, as the landed CPU figures)."""
    if precision == "fp32":
        return "none"
    return "cast" if dev.startswith("cuda") else "autocast"


def cast_inputs(inputs, precision: str, dev: str) -> Tuple[torch.Tensor, ...]:
    """Float inputs in the precision's dtype when the model is cast (sizes stay integer)."""
    if cast_mode(precision, dev) != "cast":
        return tuple(inputs)
    return tuple(t.to(torch_dtype(precision)) if t.is_floating_point() else t for t in inputs)


def torch_runner(value: Entry, inputs, backend: str, precision: str, dev: str) -> Runner:
    """A no-grad forward of a model: eager, torch.compile or a CUDA graph; see module doc."""
    module, mode = _torch_module(value, dev), cast_mode(precision, dev)
    if mode == "cast":
        module, inputs = module.to(torch_dtype(precision)), cast_inputs(inputs, precision, dev)
    if backend == "compile":
        torch._dynamo.reset()  # no recompile-limit carry-over between variants
        module = torch.compile(module)
    if backend == "cudagraph":
        return cuda_graph_runner(module, inputs)
    dtype = torch_dtype(precision) if mode == "autocast" else None

    def run():
        with torch.inference_mode(), torch.autocast(dev.split(":")[0], dtype=dtype,
                                                    enabled=dtype is not None):
            return module(*inputs)
    return run


def cuda_graph_runner(module: torch.nn.Module, inputs) -> Runner:
    """Replay of one CUDA graph of ``module(*inputs)`` (static inputs; warmed up first). The
    runner keeps the cached bucket ids the capture read: an eviction must not free them."""
    from irpe.idcache import BUCKET_IDS
    with torch.inference_mode():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                module(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with BUCKET_IDS.holding() as held, torch.cuda.graph(graph):
            out = module(*inputs)

    def run():
        graph.replay()
        return out
    run.held = held  # type: ignore[attr-defined]
    return run


def _export(value: Entry, path: Path) -> None:
    """export.onnx of a registry name, or of the module built with overrides."""

    from export.onnx import export_onnx
    from irpe.artifact.trained import default_spec
    from irpe.models import create_model
    name, overrides = entry(value)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "RANDOM weights": intended for timing
        if overrides:
            export_onnx(create_model(name, **overrides), path, spec=default_spec(name))
        else:
            export_onnx(name, path)


def ort_runner(value: Entry, inputs, cache: Path, threads: int) -> Runner:
    """An onnxruntime CPU session of a model exported by export.onnx (cached per model); the
    iRPE custom-op library when built (irpe.runtime.onnxruntime.session; the OrtOptions of
    the environment: $IRPE_ORT_CUSTOM_OPS=off: functions)."""
    from irpe.artifact.contract import io_spec
    from irpe.runtime.onnxruntime.session import OrtOptions
    from irpe.runtime.pick import open_file
    path = cache / (label(value).replace(" ", "_").replace("=", "-").strip("()") + ".onnx")
    if not path.is_file():
        _export(value, path)
    file = open_file(path, "onnxruntime", ort=OrtOptions.from_env(), threads=threads)
    task = "detection" if len(inputs) == 2 else "classification"
    feeds = {n: t.cpu().numpy() for n, t in zip(io_spec(task)[0], inputs, strict=True)}
    return lambda: file.run(feeds)


def _gpu_peak_mb(dev: str) -> Optional[float]:
    if not dev.startswith("cuda"):
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def _nvml_used_mb() -> Optional[float]:
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
    except Exception:  # NVML is optional: no pynvml, no driver
        return None


def build(name: Entry, family: str, cfg: Dict, batch: int, size, backend: str,
          precision: str) -> Tuple[Runner, Dict]:
    """Runner of one variant; RSS growth and seconds over build (+ export/compile) + 1st forward."""
    dev = cfg["device"]
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        allocated = torch.cuda.memory_allocated()
    before, start = rss_mb(), time.perf_counter()
    inputs = _inputs(family, batch, size, dev)
    if backend == "onnxruntime":
        run = ort_runner(name, inputs, cfg["cache"], cfg["threads"])
    else:
        run = torch_runner(name, inputs, backend, precision, dev)
    run()
    mem = {"rss_delta_mb": rss_mb() - before, "peak_mb": peak_rss_mb(),
           "build_s": time.perf_counter() - start}
    if dev.startswith("cuda"):  # GPU memory instead of host RSS
        mem.update(rss_delta_mb=(torch.cuda.memory_allocated() - allocated) / 2**20,
                   peak_mb=_gpu_peak_mb(dev), nvml_used_mb=_nvml_used_mb(),
                   host_rss_mb=rss_mb())
    return run, mem


def supported(backend: str, precision: str, device: str = "cpu") -> bool:
    """onnxruntime: the fp32 export on CPU only; cudagraph: CUDA only; fp16: CUDA only."""
    cuda = device.startswith("cuda")
    if backend == "onnxruntime":
        return precision == "fp32" and not cuda
    if backend == "cudagraph" or precision == "fp16":
        return cuda
    return True


def why_not(backend: str, precision: str, device: str) -> str:
    """The report note for a (backend, precision) pair not run on ``device``."""
    if backend == "onnxruntime":
        return ("the ONNX export is fp32; onnxruntime runs it as exported" if precision != "fp32"
                else "this benchmark runs onnxruntime on CPU only")
    if backend == "cudagraph":
        return "CUDA graphs need a CUDA device"
    return "fp16 runs on CUDA only (slower than fp32 on CPU)"


def measure_group(family: str, cfg: Dict, batch: int, size, backend: str,
                  precision: str) -> List[Dict]:
    """All variants of ``family`` for one setting, timed side by side."""
    base = {"family": family, "backend": backend, "precision": precision,
            "size": f"{size[0]}x{size[1]}", "batch": batch}
    runs, rows = {}, {}
    for variant, name in variants(family, cfg.get("variants")).items():
        rows[variant] = {**base, "variant": variant, "model": label(name)}
        try:
            runs[variant], mem = build(name, family, cfg, batch, size, backend, precision)
            rows[variant].update(mem)
        except Exception as exc:  # e.g. torch.compile without a compiler: report, go on
            rows[variant]["error"] = _error(exc)
    sync = torch.cuda.synchronize if cfg["device"].startswith("cuda") else (lambda: None)
    times = time_round_robin(runs, cfg["repeats"], cfg["warmup"], sync=sync)
    for variant, samples in times.items():
        rows[variant].update(latency_ms(samples), samples_ms=[t * 1e3 for t in samples])
        rows[variant]["images_per_s"] = batch / (rows[variant]["p50_ms"] / 1e3)
    _overheads(rows)
    return list(rows.values())


def _error(exc: Exception) -> str:
    """One line naming the exception (the first non-empty line of its message)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {(lines or [''])[0][:200]}"


def compile_notes(results: List[Dict]) -> List[str]:
    """Report notes on torch.compile: what it includes, or why it failed here."""
    rows = [r for r in results if r["backend"] == "compile"]
    errors = sorted({r["error"] for r in rows if "error" in r})
    if not rows:
        return []
    if errors:
        return [f"torch.compile failed on {sum('error' in r for r in rows)} of {len(rows)} "
                f"models: {'; '.join(errors)}"]
    return ["torch.compile: inductor, default mode, one compile per model and input shape "
            "(build s includes it); timed calls reuse the compiled graph"]


def _overheads(rows: Dict[str, Dict]) -> None:
    """Median time of each variant / the plain model's, when the plain model ran."""
    plain = rows.get("plain", {}).get("p50_ms")
    for row in rows.values():
        if plain and row.get("p50_ms"):
            row["overhead_vs_plain"] = row["p50_ms"] / plain


def plan(families: Sequence[str], batches: Sequence[int], backends: Sequence[str],
         precisions: Sequence[str], quick: bool,
         detr_sizes: Sequence[Tuple[int, int]] = DETR_SIZES, device: str = "cpu") -> List[Tuple]:
    """Every (family, size, batch, backend, precision) to run on ``device``, in order."""
    return [(f, s, b, be, p) for f in families for s in sizes(f, quick, detr_sizes)
            for b in batches for be in backends for p in precisions
            if supported(be, p, device)]


def skipped(backends: Sequence[str], precisions: Sequence[str],
            device: str = "cpu") -> List[str]:
    """Report notes for the requested (backend, precision) pairs that are not run."""
    return [f"{be} {p}: not run ({why_not(be, p, device)})"
            for be in backends for p in precisions if not supported(be, p, device)]


def run_all(jobs: List[Tuple], cfg: Dict) -> List[Dict]:
    """Run every job with a progress bar; rows of all of them."""
    from tqdm import tqdm
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    results: List[Dict] = []
    for family, size, batch, backend, precision in tqdm(jobs, desc="bench models", unit="cfg"):
        results += measure_group(family, cfg, batch, size, backend, precision)
    return results
