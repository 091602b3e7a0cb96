"""Compile the fused-attention kernels (irpe.fused) for a GPU architecture without a GPU
(Triton's bundled ptxas): a test and CI aid, not part of the product (not in the wheel).

tests/test_fused_lowering.py proves with it that every variant family (tools.fused_variants)
lowers to a cubin for real targets, without register spills and on the expected tensor-core
instructions (the interpreter checks none of that); tests/test_fused_attention_tools.py compiles
one forward and one backward variant.

    python -m tools.fused_aot --arch 90 qkv-fp16 k-bf16 bwd_k-fp32   # one JSON line per variant
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import torch

from irpe.fused.backward import backward_shape
from irpe.fused.launch import launch_shape, next_pow2
from tools.fused_variants import DTYPES, FAMILIES, Family

if TYPE_CHECKING:  # triton ships no type information: these name what the functions handle
    from triton.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

__all__ = ["compile_variant", "compile_backward_variant", "compile_family", "LoweringReport",
           "lower", "lower_variants", "V_BUCKETS"]

_TRITON_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
V_BUCKETS = 81  # V table of the lowering checks: product ratio 2.0 (DETR size), BLOCK_T 128


def _signature(params: Sequence[str], dtype: str, constexprs: Dict) -> Dict[str, str]:
    pointer = {"Q": dtype, "K": dtype, "V": dtype, "OUT": dtype, "TK": dtype, "TQ": dtype,
               "IDK": "i32", "IDQ": "i32", "IDV": "i32", "MASK": "i8", "S": "fp32",
               "LSE": "fp32", "DO": dtype, "DS": "fp32", "DELTA": "fp32", "DQ": "fp32",
               "DK": "fp32", "DV": "fp32", "DTK": "fp32", "DTQ": "fp32"}
    return {p: "constexpr" if p in constexprs else ("*" + pointer[p] if p in pointer else "i32")
            for p in params}


def _compile(kernel: JITFunction, dtype: torch.dtype, cx: Dict, arch: int, num_warps: int
             ) -> CompiledKernel:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    if getattr(kernel, "fn", None) is None or triton.knobs.runtime.interpret:
        raise RuntimeError("compiling for a GPU needs TRITON_INTERPRET unset")
    params = list(inspect.signature(kernel.fn).parameters)
    src = ASTSource(fn=kernel, signature=_signature(params, _TRITON_DTYPES[dtype], cx),
                    constexprs=cx)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps})


def compile_variant(dtype: torch.dtype = torch.float16, head_dim: int = 64, k_term: bool = True,
                    q_term: bool = False, v_buckets: int = 0, mask: bool = False, planes: int = 1,
                    id_table: bool = True, arch: int = 90, num_warps: Optional[int] = None
                    ) -> CompiledKernel:
    """triton.compile one forward variant for sm_``arch`` with the launch shape op.py uses;
    returns the CompiledKernel (``.asm["cubin"]``, ``.asm["ptx"]``)."""
    from irpe.fused.kernel import get_kernel
    block_m, block_n, warps = launch_shape(dtype, head_dim, v_buckets, "cuda", planes)
    cx = dict(ID_TABLE=id_table, HAS_TK=k_term, HAS_TQ=q_term, HAS_V=v_buckets > 0,
              HAS_MASK=mask, NIDK=planes, NIDQ=planes, NIDV=planes, BLOCK_M=block_m,
              BLOCK_N=block_n, BLOCK_D=next_pow2(head_dim),
              BLOCK_T=next_pow2(v_buckets) if v_buckets else 16,
              IEEE=dtype == torch.float32, DOT_F32=False, STORE_LSE=False)
    return _compile(get_kernel(), dtype, cx, arch, num_warps or warps)


def compile_backward_variant(dtype: torch.dtype = torch.float16, head_dim: int = 64,
                             k_term: bool = True, q_term: bool = False, v_term: bool = False,
                             mask: bool = False, planes: int = 1, id_table: bool = True,
                             arch: int = 90, num_warps: Optional[int] = None
                             ) -> CompiledKernel:
    """triton.compile one backward-kernel variant for sm_``arch`` (see :func:`compile_variant`)."""
    from irpe.fused.kernel_bwd import get_backward_kernel
    block, warps = backward_shape(dtype, head_dim, divmod(arch, 10))
    cx = dict(ID_TABLE=id_table, HAS_TK=k_term, HAS_TQ=q_term, HAS_V=v_term, HAS_MASK=mask,
              NIDK=planes, NIDQ=planes, NIDV=planes, BLOCK_M=block, BLOCK_N=block,
              BLOCK_D=next_pow2(head_dim), IEEE=dtype == torch.float32, DOT_F32=False)
    return _compile(get_backward_kernel(), dtype, cx, arch, num_warps or warps)


def compile_family(family: Family, dtype: torch.dtype, arch: int = 90, head_dim: int = 64,
                   v_buckets: int = V_BUCKETS) -> CompiledKernel:
    """Compile the kernel a variant family runs (forward, or backward for training families)."""
    sw = family.switches()
    common: Dict[str, Any] = dict(dtype=dtype, head_dim=head_dim, k_term=sw["HAS_TK"],
                                  q_term=sw["HAS_TQ"], mask=sw["HAS_MASK"], planes=sw["NID"],
                                  id_table=sw["ID_TABLE"], arch=arch)
    if family.backward:
        return compile_backward_variant(v_term=sw["HAS_V"], **common)
    return compile_variant(v_buckets=v_buckets if sw["HAS_V"] else 0, **common)


@dataclass
class LoweringReport:
    """What ptxas and the PTX say about one compiled variant."""
    name: str
    registers: int
    spill_stores: int  # bytes, from ptxas -v
    spill_loads: int
    shared: int        # bytes of shared memory
    wgmma: bool        # Hopper warpgroup MMA in the PTX
    mma_sync: bool     # Ampere-style mma.sync in the PTX
    seconds: float


def lower(name: str, compile_fn: Callable[..., CompiledKernel], **kwargs: Any) -> LoweringReport:
    """Compile with Triton's own ptxas run forced (no cache hit) and its -v log captured."""
    import triton
    knobs = (triton.knobs.compilation, "always_compile"), (triton.knobs.nvidia, "dump_ptxas_log")
    saved = [getattr(obj, attr) for obj, attr in knobs]
    log, start = io.StringIO(), time.perf_counter()
    try:
        for obj, attr in knobs:
            setattr(obj, attr, True)
        with contextlib.redirect_stdout(log):  # Triton prints the ptxas log
            kernel = compile_fn(**kwargs)
    finally:
        for (obj, attr), value in zip(knobs, saved, strict=True):
            setattr(obj, attr, value)
    text = log.getvalue()
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    regs = re.findall(r"Used (\d+) registers", text)
    if len(spills) != 1 or len(regs) != 1:
        raise RuntimeError(f"{name}: no single ptxas -v report in the log:\n{text[-2000:]}")
    ptx = kernel.asm["ptx"]
    return LoweringReport(name, int(regs[0]), int(spills[0][0]), int(spills[0][1]),
                          int(kernel.metadata.shared), "wgmma.mma_async" in ptx,
                          "mma.sync" in ptx, round(time.perf_counter() - start, 2))


def lower_variants(names: Sequence[str], arch: int = 90) -> List[LoweringReport]:
    """Lower ``<family>-<dtype>`` variants (a family's name from tools.fused_variants; the extra
    family ``wide_v`` is qkv with a 164-bucket V table, the >128-bucket tile path)."""
    families = {f.name: f for f in FAMILIES}
    families["wide_v"] = Family("wide_v", "qkv", method="cross")
    reports = []
    for name in names:
        family, dtype = name.rsplit("-", 1)
        buckets = 164 if family == "wide_v" else V_BUCKETS
        reports.append(lower(name, compile_family, family=families[family],
                             dtype=DTYPES[dtype], arch=arch, v_buckets=buckets))
    return reports


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: one JSON line per variant (LoweringReport fields)."""
    parser = argparse.ArgumentParser(prog="python -m tools.fused_aot", description=__doc__)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("variants", nargs="+", help="<family>-<fp16|bf16|fp32>")
    args = parser.parse_args(argv)
    for report in lower_variants(args.variants, args.arch):
        print(json.dumps(asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
