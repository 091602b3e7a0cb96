"""Precision names ("fp32", "fp16", "bf16") and their torch dtypes: the one table that serving
(torch backend) and the benchmarks cast models and inputs with."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

__all__ = ["PRECISIONS", "PRECISION_DTYPES", "torch_dtype"]

PRECISION_DTYPES: Dict[str, torch.dtype] = {
    "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PRECISIONS: Tuple[str, ...] = tuple(PRECISION_DTYPES)


def torch_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a precision name; ValueError naming the known ones otherwise."""
    try:
        return PRECISION_DTYPES[precision]
    except (KeyError, TypeError):
        raise ValueError(f"unknown precision {precision!r}; expected one of "
                         f"{', '.join(PRECISIONS)}") from None
