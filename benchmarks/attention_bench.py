"""`irpe bench attention`: fused iRPE attention vs the unfused path vs SDPA without iRPE (GPU).

One attention layer (DeiT-S batch 64; DETR encoder L = 950 / 2150 / 4800) and whole models
(DeiT-S plain / K / QK / QKV at batch 64; DETR-R50 at 800x1216 and 1344x2016), in one process:
each round times every variant once (round-robin, CUDA events, ``iters`` calls per sample), so
clock drift hits all alike; the report gives the median, the best and the spread of the rounds,
img/s, peak GPU memory (``torch.cuda.max_memory_allocated`` over one call) and ratios to the
case's baseline (SDPA without iRPE / the plain model). ``--smoke`` runs one tiny layer on the
CPU with the Triton interpreter to check the report plumbing; its times mean nothing.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from irpe.attention import rpe_attention
from irpe.errors import CLIError
from irpe.fused import kernel_available, set_fused_attention
from irpe.precision import torch_dtype
from irpe.rpe import build_rpe, get_rpe_config, randomize_tables

__all__ = ["run", "layer_cases", "model_cases", "markdown"]

# name: (batch, heads, head_dim, method, ratio, skip, grid h, grid w)
LAYERS = {
    "deit_s_bs64": (64, 6, 64, "product", 1.9, 1, 14, 14),
    "detr_L950": (2, 8, 32, "product", 2.0, 0, 25, 38),
    "detr_L2150": (2, 8, 32, "product", 2.0, 0, 43, 50),
    "detr_L4800": (2, 8, 32, "product", 2.0, 0, 60, 80),
}
SMOKE_LAYER = {"smoke_L17": (1, 2, 16, "product", 1.9, 1, 4, 4)}
DEIT = {"plain": "deit_small_patch16_224", **{
    f"irpe_{t}": f"deit_small_patch16_224_ctx_product_50_shared_{t}" for t in ("k", "qk", "qkv")}}
DETR_SIZES = {"800x1216": 4, "1344x2016": 1}  # input size: batch

Case = Tuple[str, str, Dict[str, Callable[[], object]], int, str]  # kind, name, fns, n, baseline


def _mode_call(mode: Optional[str], fn: Callable[[], object]) -> Callable[[], object]:
    def call():
        set_fused_attention(mode)
        return fn()
    return call


def layer_cases(dtype: torch.dtype, device: str, terms: List[str], layers: Dict) -> List[Case]:
    """One layer per entry: SDPA without iRPE, then iRPE ``terms`` unfused and fused."""
    cases = []
    for name, (b, h, d, method, ratio, skip, gh, gw) in layers.items():
        length = skip + gh * gw
        q, k, v = (torch.randn(b, h, length, d, device=device, dtype=dtype) for _ in range(3))
        fns = {"sdpa_no_rpe": _mode_call(None, lambda q=q, k=k, v=v, d=d: rpe_attention(
            q, k, v, d ** -0.5))}
        for on in terms:
            cfg = get_rpe_config(ratio, method, "ctx", True, skip, on)
            mods = [m.to(device, dtype) if m is not None else None for m in build_rpe(
                cfg, d, h, initializer=lambda p: torch.nn.init.normal_(p, std=0.02))]
            def fn(q=q, k=k, v=v, d=d, mods=mods, gh=gh, gw=gw):
                return rpe_attention(q, k, v, d ** -0.5, *mods, gh, gw)
            fns[f"irpe_{on}_unfused"] = _mode_call("unfused", fn)
            fns[f"irpe_{on}_fused"] = _mode_call("fused", fn)
        cases.append(("layer", name, fns, b, "sdpa_no_rpe"))
    return cases


def _net(name: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    from irpe import create_model
    return randomize_tables(create_model(name).eval().to(device, dtype), std=0.02)


def model_cases(dtype: torch.dtype, device: str, deit_batch: int,
                detr_sizes: Dict[str, int]) -> List[Case]:
    """DeiT-S plain/K/QK/QKV at ``deit_batch``; DETR-R50 plain vs iRPE-K per input size."""
    x = torch.randn(deit_batch, 3, 224, 224, device=device, dtype=dtype)
    fns = {}
    for key, name in DEIT.items():
        net = _net(name, device, dtype)
        if key == "plain":
            fns["plain"] = _mode_call(None, lambda net=net: net(x))
            continue
        fns[f"{key}_unfused"] = _mode_call("unfused", lambda net=net: net(x))
        fns[f"{key}_fused"] = _mode_call("fused", lambda net=net: net(x))
    cases = [("model", f"deit_s_bs{deit_batch}", fns, deit_batch, "plain")]
    plain, irpe = _net("detr_resnet50", device, dtype), _net("detr_resnet50_irpe", device, dtype)
    for size, batch in detr_sizes.items():
        hh, ww = (int(s) for s in size.split("x"))
        img = torch.randn(batch, 3, hh, ww, device=device, dtype=dtype)
        cases.append(("model", f"detr_r50_{size}_bs{batch}", {
            "plain": _mode_call(None, lambda img=img: plain(img)),
            "irpe_k_unfused": _mode_call("unfused", lambda img=img: irpe(img)),
            "irpe_k_fused": _mode_call("fused", lambda img=img: irpe(img))}, batch, "plain"))
    return cases


def _time_once(fn: Callable[[], object], iters: int, cuda: bool) -> float:
    """Milliseconds per call, averaged over ``iters`` back-to-back calls."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def _peak_mb(fn: Callable[[], object], cuda: bool) -> Optional[float]:
    if not cuda:
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2 ** 20


def measure(case: Case, rounds: int, iters: int, warmup: int, cuda: bool) -> List[Dict]:
    """Round-robin timing of one case's variants; rows with ratios to the baseline."""
    kind, name, fns, batch, baseline = case
    with torch.inference_mode():
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        peaks = {key: _peak_mb(fn, cuda) for key, fn in fns.items()}
        samples: Dict[str, List[float]] = {key: [] for key in fns}
        for _ in range(rounds):
            for key, fn in fns.items():
                samples[key].append(_time_once(fn, iters, cuda))
    set_fused_attention(None)
    base = statistics.median(samples[baseline])
    rows = []
    for key, ms in samples.items():
        med = statistics.median(ms)
        rows.append({"kind": kind, "case": name, "variant": key, "batch": batch,
                     "median_ms": med, "best_ms": min(ms), "spread": max(ms) / min(ms),
                     "images_per_s": batch * 1e3 / med, "peak_mb": peaks[key],
                     "time_vs_baseline": med / base, "baseline": baseline,
                     "samples_ms": ms})
    return rows


def run(dtype: str, rounds: int, iters: int, warmup: int, smoke: bool = False,
        parts: Tuple[str, ...] = ("layers", "models"), terms: Tuple[str, ...] = ("k", "qkv"),
        ) -> Tuple[Dict, List[Dict]]:
    """All cases; CLIError on a machine without CUDA unless ``smoke`` (CPU interpreter)."""
    cuda = torch.cuda.is_available()
    if smoke:
        return _smoke()
    if not cuda:
        raise CLIError("irpe bench attention needs a CUDA GPU (torch.cuda.is_available() is "
                       "False); use --smoke for a CPU check of the report plumbing")
    else:
        dt = torch_dtype(dtype)
        cases = layer_cases(dt, "cuda", list(terms), LAYERS) if "layers" in parts else []
        if "models" in parts:
            cases += model_cases(dt, "cuda", 64, DETR_SIZES)
    results = [row for case in cases for row in measure(case, rounds, iters, warmup, cuda)]
    settings = {"dtype": dtype, "rounds": rounds, "iters": iters, "warmup": warmup,
                "smoke": False, "parts": list(parts), "terms": list(terms),
                "gpu": torch.cuda.get_device_name()}
    return settings, results


def _smoke() -> Tuple[Dict, List[Dict]]:
    """One tiny fp32 layer on the CPU interpreter (TRITON_INTERPRET restored afterwards)."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        if not kernel_available(torch.device("cpu")):
            raise CLIError("--smoke needs triton and a process that has not imported it "
                           "without TRITON_INTERPRET=1 (run it as its own command)")
        case = layer_cases(torch.float32, "cpu", ["qkv"], SMOKE_LAYER)[0]
        results = measure(case, rounds=2, iters=1, warmup=1, cuda=False)
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before
    settings = {"dtype": "fp32", "rounds": 2, "iters": 1, "warmup": 1, "smoke": True,
                "parts": ["layers"], "terms": ["qkv"], "gpu": None}
    return settings, results


def markdown(doc: Dict) -> str:
    """The report as one Markdown table (ratios are time / baseline time of the same case)."""
    lines = [f"# irpe bench attention on {doc['device']}", "",
             f"{doc['date']}, git {doc['git_sha']}, torch {doc['versions'].get('torch', '-')}. "
             f"Settings: `{json.dumps(doc['settings'])}`", ""]
    lines += [f"- {n}" for n in doc.get("notes", [])] + [""]
    lines += ["| kind | case | variant | median ms | best ms | spread | img/s | peak MB | "
              "x baseline |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        peak = "-" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}"
        lines.append(f"| {r['kind']} | {r['case']} | {r['variant']} | {r['median_ms']:.3f} | "
                     f"{r['best_ms']:.3f} | {r['spread']:.2f} | {r['images_per_s']:.1f} | "
                     f"{peak} | {r['time_vs_baseline']:.2f} |")
    return "\n".join(lines) + "\n"


def save(doc: Dict, folder: Path, tag: Optional[str] = None) -> List[Path]:
    """Write bench_attention[_<tag>].json and .md into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bench_attention{'_' + tag if tag else ''}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    md = path.with_suffix(".md")
    md.write_text(markdown(doc))
    return [path, md]
