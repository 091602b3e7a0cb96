"""`irpe bench models`: forward throughput, latency and memory of plain vs iRPE models.

For each (size, batch, backend, precision) every variant of a family (plain, iRPE-K/QK/QKV)
is built and timed round-robin in the same run (ops_common.time_round_robin), so the overhead
ratio vs the plain model is not skewed by drift on a shared machine.
"""
from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.ops_common import time_round_robin
from benchmarks.report import latency_ms

DEIT = {"plain": "deit_{s}_patch16_224", "irpe_k": "deit_{s}_patch16_224_ctx_product_50_shared_k",
        "irpe_qk": "deit_{s}_patch16_224_ctx_product_50_shared_qk",
        "irpe_qkv": "deit_{s}_patch16_224_ctx_product_50_shared_qkv"}
FAMILIES: Dict[str, Dict[str, str]] = {
    **{f"deit_{s}": {k: v.format(s=s) for k, v in DEIT.items()} for s in ("tiny", "small", "base")},
    "detr_small": {"irpe_k": "detr_tiny_irpe"},
    "detr_r50": {"plain": "detr_resnet50", "irpe_k": "detr_resnet50_irpe"},
}
DETR_SIZES = ((320, 480), (480, 736))
BACKENDS = ("eager", "compile", "onnxruntime")
PRECISIONS = ("fp32", "bf16")

Runner = Callable[[], object]


def variants(family: str) -> Dict[str, str]:
    """Registered models of ``family`` by variant (missing registry entries are skipped)."""
    from irpe.models import list_models
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose from {', '.join(FAMILIES)}")
    known = set(list_models("*"))
    return {k: v for k, v in FAMILIES[family].items() if v in known}


def sizes(family: str, quick: bool) -> Sequence[Tuple[int, int]]:
    """Input (H, W) per family: DeiT 224x224; DETR two resolutions (one when quick)."""
    if family.startswith("detr"):
        return DETR_SIZES[:1] if quick else DETR_SIZES
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


def _torch_module(name: str, dev: str) -> torch.nn.Module:
    from export.onnx import output_module
    from irpe.models import create_model, model_info
    model = create_model(name).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lookup_table" in pname:
                p.normal_(0, 0.02)
    task = "detection" if model_info(name).family == "detr" else "classification"
    return output_module(model, task).to(dev)


def torch_runner(name: str, inputs, backend: str, precision: str, dev: str) -> Runner:
    """A no-grad forward of ``name`` (eager or torch.compile; bf16 via autocast)."""
    module = _torch_module(name, dev)
    if backend == "compile":
        module = torch.compile(module)
    dtype = torch.bfloat16 if precision == "bf16" else None

    def run():
        with torch.inference_mode(), torch.autocast(dev.split(":")[0], dtype=dtype,
                                                    enabled=dtype is not None):
            return module(*inputs)
    return run


def ort_runner(name: str, inputs, cache: Path, threads: int) -> Runner:
    """An onnxruntime CPU session of ``name`` exported by export.onnx (cached per name)."""
    import warnings
    import onnxruntime as ort
    from export.onnx import export_onnx, io_spec
    path = cache / f"{name}.onnx"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "RANDOM weights": intended for timing
            export_onnx(name, path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    task = "detection" if len(inputs) == 2 else "classification"
    feeds = {n: t.cpu().numpy() for n, t in zip(io_spec(task)[0], inputs)}
    return lambda: sess.run(None, feeds)


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


def build(name: str, family: str, cfg: Dict, batch: int, size, backend: str,
          precision: str) -> Tuple[Runner, Dict]:
    """Runner of one variant and its memory: RSS growth over build + first forward."""
    dev = cfg["device"]
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    before = rss_mb()
    inputs = _inputs(family, batch, size, dev)
    if backend == "onnxruntime":
        run = ort_runner(name, inputs, cfg["cache"], cfg["threads"])
    else:
        run = torch_runner(name, inputs, backend, precision, dev)
    run()
    mem = {"rss_delta_mb": rss_mb() - before, "peak_mb": peak_rss_mb()}
    if dev.startswith("cuda"):
        mem.update(peak_mb=_gpu_peak_mb(dev), nvml_used_mb=_nvml_used_mb())
    return run, mem


def supported(backend: str, precision: str) -> bool:
    """onnxruntime runs the fp32 export only; torch backends run fp32 and bf16."""
    return precision == "fp32" or backend != "onnxruntime"


def measure_group(family: str, cfg: Dict, batch: int, size, backend: str,
                  precision: str) -> List[Dict]:
    """All variants of ``family`` for one setting, timed side by side."""
    base = {"family": family, "backend": backend, "precision": precision,
            "size": f"{size[0]}x{size[1]}", "batch": batch}
    runs, rows = {}, {}
    for variant, name in variants(family).items():
        rows[variant] = {**base, "variant": variant, "model": name}
        try:
            runs[variant], mem = build(name, family, cfg, batch, size, backend, precision)
            rows[variant].update(mem)
        except Exception as exc:  # e.g. torch.compile without a compiler: report, go on
            rows[variant]["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    sync = torch.cuda.synchronize if cfg["device"].startswith("cuda") else (lambda: None)
    times = time_round_robin(runs, cfg["repeats"], cfg["warmup"], sync=sync)
    for variant, samples in times.items():
        rows[variant].update(latency_ms(samples), samples_ms=[t * 1e3 for t in samples])
        rows[variant]["images_per_s"] = batch / (rows[variant]["p50_ms"] / 1e3)
    _overheads(rows)
    return list(rows.values())


def _overheads(rows: Dict[str, Dict]) -> None:
    """Median time of each variant / the plain model's, when the plain model ran."""
    plain = rows.get("plain", {}).get("p50_ms")
    for row in rows.values():
        if plain and row.get("p50_ms"):
            row["overhead_vs_plain"] = row["p50_ms"] / plain


def plan(families: Sequence[str], batches: Sequence[int], backends: Sequence[str],
         precisions: Sequence[str], quick: bool) -> List[Tuple]:
    """Every (family, size, batch, backend, precision) to run, in order."""
    return [(f, s, b, be, p) for f in families for s in sizes(f, quick) for b in batches
            for be in backends for p in precisions if supported(be, p)]


def run_all(jobs: List[Tuple], cfg: Dict) -> List[Dict]:
    """Run every job with a progress bar; rows of all of them."""
    from tqdm import tqdm
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    results: List[Dict] = []
    for family, size, batch, backend, precision in tqdm(jobs, desc="bench models", unit="cfg"):
        results += measure_group(family, cfg, batch, size, backend, precision)
    return results
