"""The variant families of the fused-attention kernels (irpe.fused): one list for every check
that has to cover them all (GPU smoke launches in tests/gpu and `make gpu-check`, the sm_90
lowering of tools.fused_aot). A test and CI aid, not part of the product (not in the wheel).

A family fixes the kernels' compile-time switches (which iRPE terms, key padding mask, one or two
id planes, id tables or (L, L) id matrices, forward or backward); each runs in every dtype of
``DTYPES``, so a failure names ``<family>-<dtype>``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple, TypedDict

import torch

__all__ = ["DTYPES", "FAMILIES", "Family", "Variant", "variants"]

DTYPES: Dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16,
                                  "fp32": torch.float32}


class Switches(TypedDict):
    """A family's compile-time switches, named as the kernels' constexprs (NID: id planes)."""
    HAS_TK: bool
    HAS_TQ: bool
    HAS_V: bool
    HAS_MASK: bool
    NID: int
    ID_TABLE: bool


@dataclass(frozen=True)
class Family:
    """One combination of the kernels' compile-time switches, as a model would reach it."""

    name: str
    on: str                 # iRPE terms on: a subset of "qkv"
    method: str = "product"  # cross: two id planes (rows, cols)
    mode: str = "ctx"       # bias: the K/Q table is the bias row, not q @ W
    mask: bool = False      # key padding mask (DETR)
    ids: str = "table"      # "table" (relative offsets) or "matrix" ((L, L) ids)
    backward: bool = False  # the backward kernel (training)

    def switches(self) -> Switches:
        """The kernel constexprs this family sets (names of irpe/fused/kernel*.py)."""
        return {"HAS_TK": "k" in self.on, "HAS_TQ": "q" in self.on, "HAS_V": "v" in self.on,
                "HAS_MASK": self.mask, "NID": 2 if self.method == "cross" else 1,
                "ID_TABLE": self.ids == "table"}


FAMILIES: Tuple[Family, ...] = (
    Family("k", "k"),
    Family("q", "q"),
    Family("v", "v"),
    Family("qk", "qk"),
    Family("qkv", "qkv"),
    Family("k_mask", "k", mask=True),
    Family("qkv_mask", "qkv", mask=True),
    Family("cross_qkv", "qkv", method="cross"),
    Family("matrix_qkv", "qkv", ids="matrix"),
    Family("bias_qk", "qk", mode="bias"),
    Family("bwd_k", "k", backward=True),
    Family("bwd_qkv_mask", "qkv", mask=True, backward=True),
)


@dataclass(frozen=True)
class Variant:
    """A family in one dtype; ``name`` is what reports and test ids show."""

    family: Family
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.family.name}-{self.dtype}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def variants() -> List[Variant]:
    """Every family in every dtype, in list order."""
    return [Variant(f, d) for f in FAMILIES for d in DTYPES]
