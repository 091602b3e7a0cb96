"""Peak CPU memory of one DETR-R50 forward, plain vs iRPE-K (torch profiler memory events).

    python -m benchmarks.detr_memory [--quick]     (also: benchmarks.deit_forward --detr-memory)

Each variant runs one forward (800x1216, batch 1, inference_mode) under torch.profiler with
profile_memory; the peak is the running maximum of the allocation events above the bytes held
before the forward (weights excluded). iRPE-K runs the default path and, as a reference row, the
unfused one. Goal (issue 31): iRPE-K peak <= 1.15x plain.
"""
from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

import torch
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from irpe import create_model, randomize_tables
from irpe.fused import set_fused_attention

GOAL = 1.15
# key -> (model name, force the unfused path)
VARIANTS = {"plain": ("detr_resnet50", False), "irpe_k": ("detr_resnet50_irpe", False),
            "irpe_k_unfused": ("detr_resnet50_irpe", True)}
SIZE, QUICK_SIZE = (800, 1216), (128, 192)


def peak_bytes(model: torch.nn.Module, images: torch.Tensor, unfused: bool) -> int:
    """Largest net CPU bytes allocated during one forward (profiler memory events, in order)."""
    set_fused_attention("off" if unfused else None)
    try:
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU],
                                             profile_memory=True) as prof:
            model(images)
    finally:
        set_fused_attention(None)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return peak


def _build(key: str, quick: bool) -> Tuple[str, torch.nn.Module]:
    """(name, model) of a variant; quick: DETR-tiny (its plain twin: rpe_config=None)."""
    name = "detr_tiny_irpe" if quick else VARIANTS[key][0]
    overrides = {"rpe_config": None} if quick and key == "plain" else {}
    label = f"{name} (rpe_config=None)" if overrides else name
    return label, randomize_tables(create_model(name, **overrides).eval())


def measure_peaks(quick: bool = False) -> Dict:
    """Peak MiB per variant and iRPE-K / plain (``quick``: DETR-tiny at 128x192, plumbing only)."""
    size = QUICK_SIZE if quick else SIZE
    images = torch.randn(1, 3, *size)
    rows: Dict[str, Dict] = {}
    irpe = None
    for key, (_, unfused) in VARIANTS.items():
        name, model = _build(key, quick) if key == "plain" or irpe is None else irpe
        if key != "plain":
            irpe = (name, model)
        rows[key] = {"model": name, "peak_mib": peak_bytes(model, images, unfused) / 2 ** 20}
    base = rows["plain"]["peak_mib"]
    for row in rows.values():
        row["x_plain"] = row["peak_mib"] / base
    return {"size": list(size), "batch": 1, "goal": GOAL, "quick": quick, "results": rows,
            "meets_goal": rows["irpe_k"]["x_plain"] <= GOAL}


def report_lines(memory: Dict) -> List[str]:
    """Markdown table of :func:`measure_peaks`'s result."""
    height, width = memory["size"]
    lines = [f"DETR peak memory, {height}x{width}, batch 1 (torch profiler, forward only):", "",
             "| variant | model | peak MiB | x plain |", "|---|---|---|---|"]
    for key, row in memory["results"].items():
        lines.append(f"| {key} | {row['model']} | {row['peak_mib']:.1f} | {row['x_plain']:.3f} |")
    verdict = "met" if memory["meets_goal"] else "NOT met"
    return lines + ["", f"goal iRPE-K <= {memory['goal']:.2f}x plain: {verdict}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="DETR-tiny at 128x192 (plumbing)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    memory = measure_peaks(args.quick)
    print("\n".join(report_lines(memory)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
