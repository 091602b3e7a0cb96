"""Every variant family of the fused-attention kernels (tools.fused_variants) lowered for sm_90
without a GPU (Triton's compiler and bundled ptxas; the interpreter checks none of this):

* forward (inference) variants: 0 bytes of register spills, read from Triton's own ptxas -v log;
* fp16/bf16 forward tiles on wgmma (Hopper warpgroup MMA), V tables up to 128 buckets included
  (DETR size: 81); above 128 one-hot columns (buckets rounded up to a power of 2, times the id
  planes: cross) the 32-row tiles use mma.sync; fp32 uses IEEE FMA dots (no TF32), so neither
  tensor-core instruction;
* backward (training): fp16/bf16 on wgmma with at most 256 bytes of spills, fp32 without spills.

One representative per family (fp16; bias_qk compiles the same kernel as qk), plus bf16 and fp32
for the families whose launch shape differs by dtype, compiled in two processes side by side."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.fused_common import check, count_launches, inputs, needs_triton
from tests.trt_plugin_env import ROOT
from tools.fused_variants import FAMILIES

_seen, FORWARD = set(), []
for _f in FAMILIES:  # one per distinct kernel: families with equal switches share a kernel
    key = (tuple(sorted(_f.switches().items())), _f.backward)
    if not _f.backward and key not in _seen:
        _seen.add(key)
        FORWARD.append(f"{_f.name}-fp16")
FORWARD += ["qkv-bf16", "k-fp32", "qkv-fp32", "wide_v-fp16"]
BACKWARD = [f"{f.name}-fp16" for f in FAMILIES if f.backward] + ["bwd_qkv_mask-fp32"]
BACKWARD_SPILL_LIMIT = 256  # bytes per thread (measured 48-164 for fp16 at 64 x 64 tiles)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    if os.environ.get("CI") != "true":
        pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=str(ROOT),
               TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton_cache")))
    names = FORWARD + BACKWARD
    halves = [names[0::2], names[1::2]]  # CI has 2 cores
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "tools.fused_aot", "--arch", "90", *half],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for half in halves]
    found = {}
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        for line in out.splitlines():
            report = json.loads(line)
            found[report["name"]] = report
    print(f"\nlowered {len(found)} variants for sm_90 in {time.perf_counter() - start:.1f} s")
    for r in found.values():
        print(f"  {r['name']:22s} regs {r['registers']:3d} spills {r['spill_stores']:4d}/"
              f"{r['spill_loads']:4d} B smem {r['shared']:6d} wgmma {r['wgmma']!s:5s} "
              f"mma.sync {r['mma_sync']!s:5s} {r['seconds']:5.1f} s")
    assert sorted(found) == sorted(names)
    return found


def test_every_forward_family_is_lowered():
    families = {n.rsplit("-", 1)[0] for n in FORWARD}
    forward = {f.name for f in FAMILIES if not f.backward}
    assert forward - families == {"bias_qk"}  # same switches as qk: the same kernel
    assert {f.name for f in FAMILIES if f.backward} == {n.rsplit("-", 1)[0] for n in BACKWARD}


@needs_triton
@pytest.mark.parametrize("name", FORWARD)
def test_forward_variant_has_no_spills(reports, name):
    r = reports[name]
    assert (r["spill_stores"], r["spill_loads"]) == (0, 0), r
    tensor_cores = not name.endswith("fp32")
    narrow = name.startswith(("wide_v", "cross_qkv"))  # 256 one-hot columns: 32-row tiles
    assert r["wgmma"] == (tensor_cores and not narrow), r
    assert r["mma_sync"] == (tensor_cores and narrow), r


@needs_triton
@pytest.mark.parametrize("name", BACKWARD)
def test_backward_variant_spills(reports, name):
    r = reports[name]
    if name.endswith("fp32"):
        assert (r["spill_stores"], r["spill_loads"]) == (0, 0) and not r["wgmma"], r
    else:
        assert r["wgmma"] and r["spill_stores"] <= BACKWARD_SPILL_LIMIT, r


@needs_triton
@pytest.mark.parametrize("id_mode", ["table", "matrix"])
def test_v_term_detr_table_matches_reference(interpret, id_mode):
    """The column-wise V sums on the interpreter: a DETR-size table (product 2.0, 81 buckets,
    BLOCK_T 128) over 42 tokens (3 key tiles, the last partial), padded keys, both id modes."""
    from irpe.bucket import bucket_ids
    from irpe.fused.dispatch import _offset_ids
    from irpe.fused.op import fused_rpe_attention
    from irpe.fused.reference import reference_forward
    from irpe.rpe import iRPE
    gh, gw = 6, 7
    ids, grid = bucket_ids("product", 2.0, gh, gw, 0).to(torch.int32), None
    if id_mode == "table":  # the relative-offset table the dispatch builds
        ids = _offset_ids(iRPE(16, 1, "ctx", "product", 2.0, 0), gh, gw, 0, False)
        grid = [gh, gw, 0]
    mask = torch.zeros(2, gh * gw, dtype=torch.bool)
    mask[1, -9:] = True
    q, k, v = inputs(2, 2, gh * gw, 16)
    args = (q, k, v, None, None, None, None, ids[None].to(torch.int32), 81, mask, grid)
    with count_launches() as launches:
        out, s = fused_rpe_attention(*args)
    assert launches.forward == 1  # the Triton kernel ran, not the torch fallback
    ref_out, ref_s = reference_forward(*args)
    check(out, ref_out, torch.float32)
    check(s, ref_s, torch.float32)
    assert torch.allclose(s.sum(-1), torch.ones_like(s[..., 0]), atol=1e-5)
