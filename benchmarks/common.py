"""Pieces every benchmark shares: the machine's results-folder name and the CLI list parsers.

Imports nothing else of benchmarks/, so any benchmark (and the report) can use it without a
cycle; torch is imported only to name a CUDA device.
"""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from irpe.errors import InvalidInput

__all__ = ["device_name", "device_slug", "int_list", "size_list", "choice_list"]


def device_name() -> str:
    """A filesystem-safe CPU name with its widest vector unit, e.g. cpu-2c-amd-epyc-avx512: a
    virtual machine may name only the vendor ("AMD EPYC") for CPUs with and without AVX-512,
    whose CPU figures (int8 above all) differ; machines named before the suffix have none."""
    model, flags = platform.processor() or "cpu", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = re.search(r"model name\s*:\s*(.+)", text).group(1)
        flags = set(re.search(r"^flags\s*:\s*(.+)$", text, re.M).group(1).split())
    except (OSError, AttributeError):
        pass
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    isa = next((n for n, f in (("avx512", "avx512f"), ("avx2", "avx2")) if f in flags), "")
    return f"cpu-{os.cpu_count()}c-{slug}"[:52] + (f"-{isa}" if isa else "")


def device_slug(device: Optional[str] = None) -> str:
    """Results-folder name of a torch device: the CPU's name, or gpu-<CUDA device name>;
    without ``device``, this machine's (its GPU when CUDA is up, else its CPU)."""
    import torch
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device_name()
    name = torch.cuda.get_device_name(torch.device(device))
    return "gpu-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def int_list(text: str) -> List[int]:
    """'1,4,16' -> [1, 4, 16] (positive integers); InvalidInput (a ValueError) otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidInput(f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise InvalidInput(f"need positive integers, got {text!r}")
    return values


def size_list(text: str) -> List[Tuple[int, int]]:
    """'480x640,800x1216' -> [(480, 640), (800, 1216)] (positive H x W)."""
    try:
        sizes = [tuple(int(v) for v in part.lower().split("x")) for part in text.split(",")
                 if part.strip()]
    except ValueError:
        raise InvalidInput(f"not a comma-separated list of HxW sizes: {text!r}") from None
    if not sizes or any(len(s) != 2 or min(s) < 1 for s in sizes):
        raise InvalidInput(f"not a comma-separated list of HxW sizes: {text!r}")
    return sizes  # type: ignore[return-value]


def choice_list(text: str, allowed: Sequence[str], what: str) -> List[str]:
    """'a,b' -> ['a', 'b'], each one of ``allowed``."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise InvalidInput(f"unknown {what} {', '.join(bad) or repr(text)}; choose from "
                           f"{', '.join(allowed)}")
    return values
