"""Fused iRPE attention (irpe/fused) against the unfused path, on the Triton CPU interpreter.

The kernel runs with TRITON_INTERPRET=1 on CPU tensors (set per test by a fixture, so GPU tests in
the same process are unaffected); tiny shapes keep the interpreter fast. Also: the plain path
(SDPA) equals the manual one and is not what export traces, dispatch falls back with identical
results, and both paths trace under torch.compile without graph breaks.
"""
import importlib.util
import os

import pytest
import torch

from irpe.attention import RPEAttention, rpe_attention, unfused_attention
from irpe.fused import (fused_rpe_attention, fused_supported, reference_forward,
                        set_fused_attention, set_fused_ids)
from irpe.fused.op import LAUNCHES, check_inputs
from irpe.models.transformer import RPEMultiheadAttention
from irpe.rpe import build_rpe, get_rpe_config, set_traceable

HAVE_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not HAVE_TRITON and os.environ.get("CI") != "true",
    reason="triton not installed (pip install triton==3.9.0; the dev extra has it)")

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture
def interpret(monkeypatch):
    """Triton kernels on the CPU interpreter, the fused path forced (restored afterwards).

    conftest sets TRITON_INTERPRET=1 before triton is imported when there is no GPU; with a GPU
    the process compiles for real (tests/gpu) and Triton cannot switch modes in one process."""
    if torch.cuda.is_available():
        pytest.skip("GPU machine: the kernels run compiled in tests/gpu, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    set_fused_attention("fused")
    yield
    set_fused_attention(None)
    set_fused_ids("table")


def _modules(method, on, mode="ctx", skip=0, heads=2, head_dim=16, shared=True, dtype=None):
    cfg = get_rpe_config(1.9, method, mode, shared, skip, on)
    mods = build_rpe(cfg, head_dim, heads, initializer=lambda p: torch.nn.init.normal_(p, std=0.5))
    return [m.to(dtype) if m is not None and dtype else m for m in mods]


def _inputs(batch, heads, length, head_dim, dtype=torch.float32):
    return [torch.randn(batch, heads, length, head_dim).to(dtype) for _ in range(3)]


def _check(out, ref, dtype):
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err <= TOL[dtype], f"max rel err {err:.2e} > {TOL[dtype]:.0e}"


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
def test_fused_matches_unfused_fp32(interpret, method, on, mode, skip, h, w, shared):
    mods = _modules(method, on, mode, skip, shared=shared)
    q, k, v = _inputs(2, 2, skip + h * w, 16)
    assert fused_supported(q, k, *mods, h, w, None)
    out = rpe_attention(q, k, v, 0.25, *mods, h, w)
    _check(out, unfused_attention(q, k, v, 0.25, *mods, h, w), torch.float32)


@needs_triton
@pytest.mark.parametrize("case", [CASES[0], CASES[6], CASES[8]])
def test_fused_id_matrix_mode(interpret, case):
    """The second id mode: (L, L) id matrices read per tile instead of offset tables."""
    method, on, mode, skip, h, w, shared = case
    set_fused_ids("matrix")
    mods = _modules(method, on, mode, skip, shared=shared)
    q, k, v = _inputs(1, 2, skip + h * w, 16)
    out = rpe_attention(q, k, v, 0.25, *mods, h, w)
    _check(out, unfused_attention(q, k, v, 0.25, *mods, h, w), torch.float32)


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
def test_fused_low_precision_with_padding(interpret, dtype):
    """fp16/bf16 inputs (fp32 accumulation) vs the fp32 unfused path on the same values."""
    mods = _modules("product", "qkv", skip=0)
    q, k, v = _inputs(2, 2, 15, 16, dtype)
    mask = torch.zeros(2, 15, dtype=torch.bool)
    mask[1, -4:] = True
    out = rpe_attention(q, k, v, 0.25, *[m.to(dtype) for m in mods], 3, 5, mask)
    assert out.dtype == dtype
    ref = unfused_attention(q.float(), k.float(), v.float(), 0.25, *mods, 3, 5, mask)
    _check(out, ref, dtype)


@needs_triton
def test_detr_layer_padding_after_rpe(interpret):
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
    set_fused_attention("unfused")
    _check(fused, layer(x, x, x, mask, hw=(5, 8)), torch.float32)


@needs_triton
def test_model_block_uses_fused_and_matches(interpret):
    """RPEAttention (DeiT block, cls token, grid inferred from L) through the dispatch."""
    attn = RPEAttention(32, 2, rpe_config=get_rpe_config(1.9, "product", "ctx", True, 1,
                                                         "qkv")).eval()
    for p in (attn.rpe_q, attn.rpe_k, attn.rpe_v):
        torch.nn.init.normal_(p.lookup_table_weight, std=0.5)
    x = torch.randn(2, 17, 32)
    before = LAUNCHES[0]
    fused = attn(x)
    assert LAUNCHES[0] == before + 1
    set_fused_attention("unfused")
    _check(fused, attn(x), torch.float32)


@needs_triton
def test_backward_matches_unfused(interpret):
    """Gradients by the Triton backward kernel equal autograd of the unfused path (cross with
    V term and both id planes; bias mode with broadcast tables; padding)."""
    mods = _modules("cross", "qkv", skip=1)
    mods_b = _modules("euc", "qk", "bias", skip=1)
    for mods_i in (mods, mods_b):
        params = [p for m in mods_i if m is not None for p in m.parameters()]
        q, k, v = (t.requires_grad_() for t in _inputs(1, 2, 13, 16))
        mask = torch.zeros(1, 13, dtype=torch.bool)
        mask[0, -2:] = True
        grads = []
        before = LAUNCHES[1]
        for mode in ("fused", "unfused"):
            set_fused_attention(mode)
            out = rpe_attention(q, k, v, 0.25, *mods_i, 3, 4, mask)
            grads.append(torch.autograd.grad((out * out).sum(), [q, k, v] + params))
        assert LAUNCHES[1] == before + 1  # the Triton backward kernel ran
        for g_fused, g_ref in zip(*grads):
            _check(g_fused, g_ref, torch.float32)


def test_reference_in_row_chunks_matches_one_chunk(monkeypatch):
    """The torch fallback/backward works in query-row chunks (O(rows x L) memory): forcing
    chunks of 5 rows gives the single-chunk results, both id layouts, grads included."""
    import irpe.fused.reference as ref
    from irpe.bucket import bucket_ids
    from irpe.fused.dispatch import _offset_ids
    from irpe.rpe import iRPE
    q, k, v = _inputs(2, 2, 13, 16)
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
        for a, b in zip([*whole[0], *whole[1]], [*parts[0], *parts[1]]):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@needs_triton
def test_op_direct_and_reference(interpret):
    """The op on the interpreter equals its torch reference (broadcast tables, two id planes)."""
    from irpe.bucket import bucket_ids
    rows = bucket_ids("cross_rows", 1.9, 3, 4, 0).to(torch.int32)
    cols = bucket_ids("cross_cols", 1.9, 3, 4, 0).to(torch.int32) + 7
    ids = torch.stack([rows, cols])
    q, k, v = _inputs(2, 3, 12, 16)
    table_k = torch.randn(2, 1, 12, 14)
    table_q = torch.randn(1, 3, 1, 14).expand(1, 3, 12, 14)  # bias mode: rows broadcast
    args = (q, k, v, table_k, ids, table_q, ids, ids, 14, None)
    out, s = fused_rpe_attention(*args)
    ref_out, ref_s = reference_forward(*args)
    _check(out, ref_out, torch.float32)
    _check(s, ref_s, torch.float32)
    assert torch.allclose(s.sum(-1), torch.full_like(s[..., 0], 2.0), atol=1e-5)  # 2 planes


def test_op_rejects_bad_input():
    q, k, v = _inputs(1, 2, 6, 16)
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


def test_cpu_without_interpreter_takes_unfused(monkeypatch):
    """On CPU (no interpreter) auto and even forced "fused" fall back with identical output."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mods = _modules("product", "qk", skip=1)
    q, k, v = _inputs(1, 2, 10, 16)
    ref = unfused_attention(q, k, v, 0.25, *mods, 3, 3)
    for mode in ("auto", "fused"):
        set_fused_attention(mode)
        try:
            assert not fused_supported(q, k, *mods, 3, 3, None)
            before = LAUNCHES[0]
            assert torch.equal(rpe_attention(q, k, v, 0.25, *mods, 3, 3), ref)
            assert LAUNCHES[0] == before
        finally:
            set_fused_attention(None)


@needs_triton
def test_unsupported_cases_fall_back_identically(interpret):
    """Dropout in training, traceable (export) modules and cross-attention shapes: unfused."""
    mods = _modules("product", "k")
    q, k, v = _inputs(1, 2, 9, 16)
    drop = torch.nn.Dropout(0.5).train()
    assert not fused_supported(q, k, *mods, 3, 3, drop)
    assert not fused_supported(q, k[:, :, :4], *mods, 3, 3, None)
    set_traceable(mods[1], True)
    assert not fused_supported(q, k, *mods, 3, 3, None)
    assert torch.equal(rpe_attention(q, k, v, 0.25, *mods, 3, 3),
                       unfused_attention(q, k, v, 0.25, *mods, 3, 3))


def test_env_switch(monkeypatch):
    from irpe.fused import fused_mode
    for value, mode in (("0", "unfused"), ("fused", "fused"), ("auto", "auto"), ("junk", "auto")):
        monkeypatch.setenv("IRPE_FUSED_ATTENTION", value)
        assert fused_mode() == mode
    set_fused_attention("unfused")
    try:
        monkeypatch.setenv("IRPE_FUSED_ATTENTION", "1")
        assert fused_mode() == "unfused"  # the function wins over the env var
    finally:
        set_fused_attention(None)


def test_plain_path_is_sdpa_and_matches_manual():
    """Without iRPE: SDPA (eager) equals the manual path, padding mask and cross shapes too."""
    q, k, v = _inputs(2, 2, 11, 16)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[0, -3:] = True
    for m in (None, mask):
        _check(rpe_attention(q, k, v, 0.25, key_padding_mask=m),
               unfused_attention(q, k, v, 0.25, key_padding_mask=m), torch.float32)
    q5 = q[:, :, :5]
    _check(rpe_attention(q5, k, v, 0.25, key_padding_mask=mask),
           unfused_attention(q5, k, v, 0.25, key_padding_mask=mask), torch.float32)


def test_export_trace_keeps_manual_plain_path():
    """Tracing (ONNX export) records MatMul/Softmax, not SDPA: exported graphs are unchanged."""
    attn = RPEAttention(32, 2).eval()
    traced = torch.jit.trace(attn, torch.randn(1, 5, 32))
    graph = str(traced.inlined_graph)
    assert "scaled_dot_product_attention" not in graph and "softmax" in graph
    eager_graph = str(torch.jit.trace(lambda q: torch.nn.functional.scaled_dot_product_attention(
        q, q, q), torch.randn(1, 1, 3, 4)).graph)
    assert "scaled_dot_product_attention" in eager_graph  # the check above can see SDPA


@pytest.mark.parametrize("mode", ["unfused", "fused"])
def test_compile_fullgraph_no_graph_breaks(monkeypatch, mode):
    """torch.compile traces the unfused path and the fused op (custom op + fake) without
    breaks, even with cold id caches; the compiled (eager backend) output equals eager."""
    if mode == "fused":
        if not HAVE_TRITON and os.environ.get("CI") != "true":
            pytest.skip("triton not installed")
        if torch.cuda.is_available():
            pytest.skip("GPU machine: tests/gpu checks compile with the real kernel")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    set_fused_attention(mode)
    try:
        torch._dynamo.reset()
        attn = RPEAttention(32, 2, rpe_config=get_rpe_config(1.9, "product", "ctx", True, 1,
                                                             "qkv")).eval()
        x = torch.randn(1, 10, 32)
        explain = torch._dynamo.explain(attn)(x)
        assert explain.graph_break_count == 0, explain.break_reasons
        compiled = torch.compile(attn, backend="eager", fullgraph=True)
        _check(compiled(x), attn(x), torch.float32)
    finally:
        set_fused_attention(None)
        torch._dynamo.reset()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_bench_attention_refuses_without_gpu(capsys, tmp_path):
    from irpe.cli import main
    assert main(["bench", "attention", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs a CUDA GPU" in err and "--smoke" in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())
    assert main(["bench", "attention", "--smoke", "--terms", "k,z", "--out", str(tmp_path)]) == 2


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU variant")
def test_bench_attention_smoke_report(tmp_path):
    """--smoke: tiny layer on the CPU interpreter, round-robin rows, JSON + Markdown written."""
    import json

    from irpe.cli import main
    before = os.environ.get("TRITON_INTERPRET")
    assert main(["bench", "attention", "--smoke", "--out", str(tmp_path), "--tag", "t"]) == 0
    doc = json.loads((tmp_path / "bench_attention_t.json").read_text())
    assert doc["kind"] == "attention" and doc["settings"]["smoke"] is True
    variants = {r["variant"]: r for r in doc["results"]}
    assert set(variants) == {"sdpa_no_rpe", "irpe_qkv_unfused", "irpe_qkv_fused"}
    assert variants["sdpa_no_rpe"]["time_vs_baseline"] == 1.0
    assert all(len(r["samples_ms"]) == 2 and r["median_ms"] > 0 for r in doc["results"])
    md = (tmp_path / "bench_attention_t.md").read_text()
    assert md.startswith("# irpe bench attention") and "SMOKE RUN" in md
    assert os.environ.get("TRITON_INTERPRET") == before  # restored after the smoke run


@needs_triton
def test_kernel_lowers_to_cubin_without_gpu(tmp_path):
    """The interpreter does not check GPU lowering: compile one full forward and backward
    variant (K and Q terms, two id planes, V term, padding, fp16) for sm_80 with Triton's
    bundled ptxas (the backward's table gradients are atomics). In a
    fresh process: the interpreter leaves triton.language patched in the process that ran it."""
    import subprocess
    import sys
    code = ("import torch; from irpe.fused.aot import compile_variant, compile_backward_variant;"
            "k = compile_variant(torch.float16, head_dim=32, q_term=True, v_buckets=50, "
            "mask=True, planes=2, arch=80); b = compile_backward_variant(torch.float16, "
            "head_dim=32, q_term=True, v_term=True, mask=True, planes=2, arch=80); "
            "print(min(len(k.asm['cubin']), len(b.asm['cubin'])), 'atom' in b.asm['ptx'])")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    size, has_atomics = done.stdout.split()
    assert int(size) > 1000 and has_atomics == "True"


@needs_triton
def test_detr_model_fused_matches_unfused(interpret):
    """Whole detr_tiny_irpe, two images padded differently: the models dispatch to the kernel
    (grid from the feature map, padding mask after the iRPE-K term) with unchanged logits."""
    from irpe import create_model
    net = create_model("detr_tiny_irpe").eval()
    x, sizes = torch.randn(2, 3, 96, 128), torch.tensor([[96, 128], [64, 96]])
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "lookup_table" in name:
                p.normal_(0, 0.5)
        before = LAUNCHES[0]
        fused = net(x, sizes)
        assert LAUNCHES[0] > before  # the encoder layers ran the kernel
        set_fused_attention("unfused")
        ref = net(x, sizes)
    _check(fused["pred_logits"], ref["pred_logits"], torch.float32)
    _check(fused["pred_boxes"], ref["pred_boxes"], torch.float32)


@needs_triton
def test_compile_training_step_through_fused_ops(interpret):
    """torch.compile(fullgraph, aot_eager) of forward + backward through both custom ops (the
    fakes must match the real output layouts) equals eager; DeiT block with a permuted q."""
    torch._dynamo.reset()
    attn = RPEAttention(32, 2, rpe_config=get_rpe_config(1.9, "product", "ctx", True, 1, "qkv"))
    for p in (attn.rpe_q, attn.rpe_k, attn.rpe_v):
        torch.nn.init.normal_(p.lookup_table_weight, std=0.5)
    x = torch.randn(2, 10, 32, requires_grad=True)
    params = [x] + list(attn.parameters())

    def step(inp):
        return attn(inp).square().sum()

    eager = torch.autograd.grad(step(x), params)
    compiled = torch.autograd.grad(torch.compile(step, backend="aot_eager", fullgraph=True)(x),
                                   params)
    for a, b in zip(compiled, eager):
        _check(a, b, torch.float32)
    torch._dynamo.reset()
