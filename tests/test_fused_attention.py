"""Fused iRPE attention (irpe/fused) against the unfused path, on the Triton CPU interpreter.

The kernels run with TRITON_INTERPRET=1 on CPU tensors (tests/conftest.py turns the interpreter
on before triton is imported on machines without a GPU); tiny shapes keep the interpreter fast.
Forward and backward for every method x K/Q/V, both id modes, padding, fp16/bf16, the models'
dispatch and its fallbacks. Compile, export, benchmark: test_fused_attention_tools.py.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from irpe.attention import RPEAttention, rpe_attention, unfused_attention
from irpe.fused import (
    fused_rpe_attention,
    fused_supported,
    reference_forward,
    set_fused_attention,
    set_fused_ids,
)
from irpe.fused.op import check_inputs
from irpe.models.transformer import RPEMultiheadAttention
from irpe.rpe import get_rpe_config, set_traceable
from tests.fused_common import check, count_launches, inputs, modules, needs_triton

ROOT = Path(__file__).resolve().parents[1]


# (method, on, mode, skip, grid h, grid w, shared head): every method, every term, bias and
# contextual, skip 0/1, odd and non-square grids
CASES = [
    ("product", "qkv", "ctx", 1, 3, 3, True),
    ("product", "k", "ctx", 0, 3, 5, False),
    ("product", "q", "ctx", 1, 5, 2, True),
    ("product", "v", "ctx", 0, 4, 3, True),
    ("euc", "qkv", "ctx", 0, 5, 3, False),
    ("quant", "kv", "ctx", 1, 3, 4, True),
    ("cross", "qkv", "ctx", 1, 4, 5, True),
    ("cross", "qk", "bias", 0, 3, 4, False),
    ("euc", "qk", "bias", 1, 2, 5, True),
    ("product", "k", "bias", 0, 1, 7, False),
]


@needs_triton
@pytest.mark.parametrize("method,on,mode,skip,h,w,shared", CASES)
@pytest.mark.usefixtures("interpret")
def test_fused_matches_unfused_fp32(method, on, mode, skip, h, w, shared):
    mods = modules(method, on, mode, skip, shared=shared)
    q, k, v = inputs(2, 2, skip + h * w, 16)
    assert fused_supported(q, k, *mods, h, w, None)
    out = rpe_attention(q, k, v, 0.25, *mods, h, w)
    check(out, unfused_attention(q, k, v, 0.25, *mods, h, w), torch.float32)


@needs_triton
@pytest.mark.parametrize("case", [CASES[0], CASES[6], CASES[8]])
@pytest.mark.usefixtures("interpret")
def test_fused_id_matrix_mode(case):
    """The second id mode: (L, L) id matrices read per tile instead of offset tables."""
    method, on, mode, skip, h, w, shared = case
    set_fused_ids("matrix")
    mods = modules(method, on, mode, skip, shared=shared)
    q, k, v = inputs(1, 2, skip + h * w, 16)
    out = rpe_attention(q, k, v, 0.25, *mods, h, w)
    check(out, unfused_attention(q, k, v, 0.25, *mods, h, w), torch.float32)


@pytest.mark.parametrize("method,ratio", [("product", 1.9), ("euc", 1.9), ("quant", 33),
                                          ("cross_rows", 20), ("cross_cols", 2.0)])
@pytest.mark.parametrize("traceable", [False, True])
def test_offset_tables_expand_to_exact_ids(method, ratio, traceable):
    """Relative-offset id tables (O(L)) expand to exactly the unfused path's (L, L) ids."""
    from irpe.bucket import bucket_ids
    from irpe.fused.dispatch import _offset_ids
    from irpe.fused.reference import expand_ids
    from irpe.rpe import iRPE
    for h, w, skip in ((1, 1, 0), (3, 5, 1), (7, 4, 0), (14, 14, 1), (5, 31, 0)):
        m = iRPE(4, 1, "ctx", method, ratio, skip)
        table = _offset_ids(m, h, w, skip, traceable)[None]
        assert table.shape == (1, (2 * h - 1) * (2 * w - 1) + 1)
        ids = expand_ids(table, [h, w, skip], skip + h * w)[0]
        assert torch.equal(ids, bucket_ids(method, ratio, h, w, skip)), (h, w, skip)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.usefixtures("interpret")
def test_fused_low_precision_with_padding(dtype):
    """fp16/bf16 inputs (fp32 accumulation) vs the fp32 unfused path on the same values."""
    mods = modules("product", "qkv", skip=0)
    q, k, v = inputs(2, 2, 15, 16, dtype)
    mask = torch.zeros(2, 15, dtype=torch.bool)
    mask[1, -4:] = True
    out = rpe_attention(q, k, v, 0.25, *[m.to(dtype) for m in mods], 3, 5, mask)
    assert out.dtype == dtype
    ref = unfused_attention(q.float(), k.float(), v.float(), 0.25, *mods, 3, 5, mask)
    check(out, ref, dtype)


@needs_triton
@pytest.mark.usefixtures("interpret")
def test_detr_layer_padding_after_rpe():
    """DETR encoder self-attention: key padding masked after the iRPE-K term, non-square grid,
    more keys than one tile (L = 40 > BLOCK_N), two images padded differently."""
    torch.manual_seed(1)
    layer = RPEMultiheadAttention(32, 2, rpe_config=get_rpe_config(2.0, "product", "ctx", True,
                                                                   0, "k")).eval()
    torch.nn.init.normal_(layer.rpe_k.lookup_table_weight, std=0.5)
    x = torch.randn(2, 40, 32)
    mask = torch.zeros(2, 5, 8, dtype=torch.bool)
    mask[0, :, 6:] = True
    mask[1, 3:, :] = True
    mask = mask.flatten(1)
    fused = layer(x, x, x, mask, hw=(5, 8))
    set_fused_attention("off")
    check(fused, layer(x, x, x, mask, hw=(5, 8)), torch.float32)


@needs_triton
@pytest.mark.usefixtures("interpret")
def test_model_block_uses_fused_and_matches():
    """RPEAttention (DeiT block, cls token, grid inferred from L) through the dispatch."""
    attn = RPEAttention(32, 2, rpe_config=get_rpe_config(1.9, "product", "ctx", True, 1,
                                                         "qkv")).eval()
    for p in (attn.rpe_q, attn.rpe_k, attn.rpe_v):
        torch.nn.init.normal_(p.lookup_table_weight, std=0.5)
    x = torch.randn(2, 17, 32)
    with count_launches() as launches:
        fused = attn(x)
    assert launches.forward == 1
    set_fused_attention("off")
    check(fused, attn(x), torch.float32)


@needs_triton
@pytest.mark.usefixtures("interpret")
def test_backward_matches_unfused():
    """Gradients by the Triton backward kernel equal autograd of the unfused path (cross with
    V term and both id planes; bias mode with broadcast tables; padding)."""
    mods = modules("cross", "qkv", skip=1)
    mods_b = modules("euc", "qk", "bias", skip=1)
    for mods_i in (mods, mods_b):
        params = [p for m in mods_i if m is not None for p in m.parameters()]
        q, k, v = (t.requires_grad_() for t in inputs(1, 2, 13, 16))
        mask = torch.zeros(1, 13, dtype=torch.bool)
        mask[0, -2:] = True
        grads = []
        with count_launches() as launches:
            for mode in ("on", "off"):
                set_fused_attention(mode)
                out = rpe_attention(q, k, v, 0.25, *mods_i, 3, 4, mask)
                grads.append(torch.autograd.grad((out * out).sum(), [q, k, v] + params))
        assert launches.backward == 1  # the Triton backward kernel ran
        for g_fused, g_ref in zip(*grads, strict=True):
            check(g_fused, g_ref, torch.float32)


def test_reference_in_row_chunks_matches_one_chunk(monkeypatch):
    """The torch fallback/backward works in query-row chunks (O(rows x L) memory): forcing
    chunks of 5 rows gives the single-chunk results, both id layouts, grads included."""
    import irpe.fused.reference as ref
    from irpe.bucket import bucket_ids
    from irpe.fused.dispatch import _offset_ids
    from irpe.rpe import iRPE
    q, k, v = inputs(2, 2, 13, 16)
    mask = torch.zeros(2, 13, dtype=torch.bool)
    mask[1, -3:] = True
    m = iRPE(16, 1, "ctx", "product", 1.9, 1)
    layouts = [(bucket_ids("product", 1.9, 3, 4, 1).to(torch.int32)[None], None),
               (_offset_ids(m, 3, 4, 1, False).to(torch.int32)[None], [3, 4, 1])]
    tk, tq = torch.randn(2, 2, 13, 50), torch.randn(1, 1, 13, 50)
    for ids, grid in layouts:
        args = (q, k, v, tk, ids, tq, ids, ids, 50, mask, grid)
        g_out, g_s = torch.randn(2, 2, 13, 16), torch.randn(2, 2, 13, 50)
        whole = ref.reference_forward(*args), ref.reference_backward(args, g_out, g_s)
        monkeypatch.setattr(ref, "CHUNK_ELEMS", 5 * 2 * 2 * 13)
        parts = ref.reference_forward(*args), ref.reference_backward(args, g_out, g_s)
        monkeypatch.setattr(ref, "CHUNK_ELEMS", 1 << 24)
        for a, b in zip([*whole[0], *whole[1]], [*parts[0], *parts[1]], strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.usefixtures("interpret")
def test_op_direct_and_reference():
    """The op on the interpreter equals its torch reference (broadcast tables, two id planes)."""
    from irpe.bucket import bucket_ids
    rows = bucket_ids("cross_rows", 1.9, 3, 4, 0).to(torch.int32)
    cols = bucket_ids("cross_cols", 1.9, 3, 4, 0).to(torch.int32) + 7
    ids = torch.stack([rows, cols])
    q, k, v = inputs(2, 3, 12, 16)
    table_k = torch.randn(2, 1, 12, 14)
    table_q = torch.randn(1, 3, 1, 14).expand(1, 3, 12, 14)  # bias mode: rows broadcast
    args = (q, k, v, table_k, ids, table_q, ids, ids, 14, None)
    out, s = fused_rpe_attention(*args)
    ref_out, ref_s = reference_forward(*args)
    check(out, ref_out, torch.float32)
    check(s, ref_s, torch.float32)
    assert torch.allclose(s.sum(-1), torch.full_like(s[..., 0], 2.0), atol=1e-5)  # 2 planes


def test_op_rejects_bad_input():
    q, k, v = inputs(1, 2, 6, 16)
    ids = torch.zeros(1, 6, 6, dtype=torch.int32)
    with pytest.raises(ValueError, match="share one"):
        check_inputs(q, k[:, :, :5], v, None, None, None, None, None, 0, None)
    with pytest.raises(ValueError, match="table_k must be"):
        check_inputs(q, k, v, torch.zeros(1, 2, 5, 3), ids, None, None, None, 0, None)
    with pytest.raises(ValueError, match="go together"):
        check_inputs(q, k, v, torch.zeros(1, 2, 6, 3), None, None, None, None, 0, None)
    with pytest.raises(ValueError, match="ids_v must be"):
        check_inputs(q, k, v, None, None, None, None, ids[:, :5], 3, None)
    with pytest.raises(ValueError, match="key_padding_mask"):
        check_inputs(q, k, v, None, None, None, None, None, 0, torch.zeros(1, 5, dtype=bool))
    with pytest.raises(ValueError, match="unknown fused attention mode"):
        set_fused_attention("fast")
    with pytest.raises(ValueError, match="unknown fused id mode"):
        set_fused_ids("onthefly")
    table = torch.zeros(1, 5 * 3 + 1, dtype=torch.int32)  # grid 3x2 + 0 skip = 6 tokens
    check_inputs(q, k, v, None, None, None, None, table, 3, None, [3, 2, 0])
    with pytest.raises(ValueError, match="grid must be"):
        check_inputs(q, k, v, None, None, None, None, table, 3, None, [3, 3, 0])
    with pytest.raises(ValueError, match=r"ids_v must be \(1\|2, 16\)"):
        check_inputs(q, k, v, None, None, None, None, ids, 3, None, [3, 2, 0])


def test_cpu_without_interpreter_takes_cpu_path(monkeypatch):
    """On CPU without the interpreter, auto and even forced ("on") launch no Triton kernel:
    they take the CPU path (irpe.fused.cpu; tests/test_attention_cpu_fused.py), same values."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mods = modules("product", "qk", skip=1)
    q, k, v = inputs(1, 2, 10, 16)
    ref = unfused_attention(q, k, v, 0.25, *mods, 3, 3)
    for mode in ("auto", "on"):
        set_fused_attention(mode)
        try:
            assert not fused_supported(q, k, *mods, 3, 3, None)
            with count_launches() as launches:
                check(rpe_attention(q, k, v, 0.25, *mods, 3, 3), ref, torch.float32)
            assert launches.forward == 0
        finally:
            set_fused_attention(None)


@needs_triton
@pytest.mark.usefixtures("interpret")
def test_unsupported_cases_fall_back_identically():
    """Dropout in training, traceable (export) modules and cross-attention shapes: unfused."""
    mods = modules("product", "k")
    q, k, v = inputs(1, 2, 9, 16)
    drop = torch.nn.Dropout(0.5).train()
    assert not fused_supported(q, k, *mods, 3, 3, drop)
    assert not fused_supported(q, k[:, :, :4], *mods, 3, 3, None)
    set_traceable(mods[1], True)
    assert not fused_supported(q, k, *mods, 3, 3, None)
    assert torch.equal(rpe_attention(q, k, v, 0.25, *mods, 3, 3),
                       unfused_attention(q, k, v, 0.25, *mods, 3, 3))


def test_env_switch_values(monkeypatch):
    from irpe.fused.dispatch import mode_from_env
    """auto / on / off in any case; the older spellings (irpe.switch.SWITCH_ALIASES) too."""
    for value, mode in (("off", "off"), (" ON ", "on"), (" Auto ", "auto"), ("", "auto"),
                        ("0", "off"), ("unfused", "off"), ("1", "on"), ("fused", "on")):
        monkeypatch.setenv("IRPE_FUSED_ATTENTION", value)
        assert mode_from_env() == mode
    monkeypatch.setenv("IRPE_FUSED_ATTENTION", "junk")
    with pytest.warns(UserWarning, match="IRPE_FUSED_ATTENTION: fused attention mode must be"):
        assert mode_from_env() == "auto"  # an import must not fail on a variable


def test_env_switch_read_once_at_import_and_the_function_wins():
    """A process started with IRPE_FUSED_ATTENTION=off runs unfused; changing the variable
    later changes nothing (read once); set_fused_attention wins over it; None gives it back."""
    code = ("import os; from irpe.fused import fused_mode, set_fused_attention as s;"
            "a = fused_mode(); os.environ['IRPE_FUSED_ATTENTION'] = 'on'; b = fused_mode();"
            "s('auto'); c = fused_mode(); s(None); print(a, b, c, fused_mode())")
    env = dict(os.environ, IRPE_FUSED_ATTENTION="off", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["off", "off", "auto", "off"]


@needs_triton
@pytest.mark.usefixtures("interpret")
def test_detr_model_fused_matches_unfused():
    """Whole detr_tiny_irpe, two images padded differently: the models dispatch to the kernel
    (grid from the feature map, padding mask after the iRPE-K term) with unchanged logits."""
    from irpe import create_model, randomize_tables
    net = randomize_tables(create_model("detr_tiny_irpe").eval(), std=0.5)
    x, sizes = torch.randn(2, 3, 96, 128), torch.tensor([[96, 128], [64, 96]])
    with torch.no_grad():
        with count_launches() as launches:
            fused = net(x, sizes)
        assert launches.forward > 0  # the encoder layers ran the kernel
        set_fused_attention("off")
        ref = net(x, sizes)
    check(fused["pred_logits"], ref["pred_logits"], torch.float32)
    check(fused["pred_boxes"], ref["pred_boxes"], torch.float32)
