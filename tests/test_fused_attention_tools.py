"""Fused iRPE attention tooling: SDPA plain path and export, torch.compile (no graph breaks,
compiled training step), GPU lowering to a cubin without a GPU, `irpe bench attention`."""
import os

import pytest
import torch

from irpe.attention import RPEAttention, rpe_attention, unfused_attention
from irpe.fused import set_fused_attention
from irpe.rpe import get_rpe_config
from tests.fused_common import HAVE_TRITON, check, inputs, needs_triton


def test_plain_path_is_sdpa_and_matches_manual():
    """Without iRPE: SDPA (eager) equals the manual path, padding mask and cross shapes too."""
    q, k, v = inputs(2, 2, 11, 16)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[0, -3:] = True
    for m in (None, mask):
        check(rpe_attention(q, k, v, 0.25, key_padding_mask=m),
               unfused_attention(q, k, v, 0.25, key_padding_mask=m), torch.float32)
    q5 = q[:, :, :5]
    check(rpe_attention(q5, k, v, 0.25, key_padding_mask=mask),
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


@pytest.mark.parametrize("mode", ["off", "on"])
def test_compile_fullgraph_no_graph_breaks(monkeypatch, mode):
    """torch.compile traces the unfused path and the fused op (custom op + fake) without
    breaks, even with cold id caches; the compiled (eager backend) output equals eager."""
    if mode == "on":
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
        check(compiled(x), attn(x), torch.float32)
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
    code = ("import torch; from tools.fused_aot import compile_variant, compile_backward_variant;"
            "k = compile_variant(torch.float16, head_dim=32, q_term=True, v_buckets=50, "
            "mask=True, planes=2, arch=80); b = compile_backward_variant(torch.float16, "
            "head_dim=32, q_term=True, v_term=True, mask=True, planes=2, arch=80); "
            "print(min(len(k.asm['cubin']), len(b.asm['cubin'])), 'atom' in b.asm['ptx'])")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/ is found there
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    size, has_atomics = done.stdout.split()
    assert int(size) > 1000 and has_atomics == "True"


@needs_triton
@pytest.mark.usefixtures("interpret")
def test_compile_training_step_through_fused_ops():
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
    for a, b in zip(compiled, eager, strict=True):
        check(a, b, torch.float32)
    torch._dynamo.reset()
