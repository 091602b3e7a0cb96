"""The native iRPE attention kernel on CPU (libirpe_cpu_attention, irpe/fused/cpu_library.py)
against the unfused path: every method x K/Q/V term, skip, grid shapes, head dims that are not
a multiple of the kernel's padding, batch 1 and many; the dispatch (inference on shared
contextual tables only; training, padding masks, bias tables and per-head tables take the SDPA
path); the thread count; the C ABI's errors; a library that is missing or does not load."""
import ctypes

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from irpe import create_model, randomize_tables
from irpe.attention import rpe_attention, unfused_attention
from irpe.fused import cpu_library as cl
from irpe.fused import set_fused_attention
from irpe.rpe import build_rpe, get_rpe_config

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
CASES = [  # (method, on, skip, grid h, grid w, head dim)
    ("product", "k", 1, 14, 14, 64),
    ("product", "q", 0, 3, 5, 16),
    ("product", "v", 1, 4, 3, 24),
    ("product", "qk", 1, 7, 9, 32),
    ("product", "qkv", 0, 5, 2, 48),
    ("euc", "qkv", 1, 5, 3, 16),
    ("quant", "kv", 1, 3, 4, 64),
    ("quant", "qv", 0, 6, 6, 8),
    ("euc", "k", 0, 1, 7, 80),
]


@pytest.fixture(scope="module")
def library(ort_library):
    """The kernel built with the ORT library (same CMake project), used by every test here."""
    path = ort_library.parent / cl.LIBRARY_FILE
    assert path.is_file(), f"{path} was not built beside {ort_library.name}"
    cl.set_cpu_library(path)
    yield cl.cpu_library()
    cl.set_cpu_library(True)


@pytest.fixture(autouse=True)
def auto_mode(library):
    set_fused_attention(None)
    cl.set_cpu_library(library.path)
    yield
    set_fused_attention(None)
    cl.set_cpu_library(library.path)


def _modules(method, on, skip, head_dim, heads=3, shared=True, mode="ctx"):
    cfg = get_rpe_config(1.9, method, mode, shared, skip, on)
    return build_rpe(cfg, head_dim, heads, initializer=lambda p: torch.nn.init.normal_(p, std=0.5))


def _qkv(batch, heads, length, head_dim, seed=0):
    """q, k, v as the model makes them: strided views of one packed qkv tensor."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, length, 3, heads, head_dim, generator=gen)
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def _ops(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def _close(out, ref, tol=1e-5):
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    assert err <= tol, f"max rel err {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("method,on,skip,h,w,d", CASES)
@pytest.mark.parametrize("batch", [1, 5])
def test_kernel_matches_unfused(method, on, skip, h, w, d, batch):
    mods = _modules(method, on, skip, d)
    q, k, v = _qkv(batch, 3, skip + h * w, d, seed=h * w + d)
    scale = d ** -0.5
    ref = unfused_attention(q, k, v, scale, *mods, h, w)
    with torch.inference_mode():
        assert cl.library_supported(q, k, v, *mods, None)
        ops = _ops(lambda: rpe_attention(q, k, v, scale, *mods, h, w))
        out = rpe_attention(q, k, v, scale, *mods, h, w)
    assert FLASH not in ops and "aten::baddbmm_" not in ops  # the kernel, not the SDPA path
    assert out.shape == ref.shape
    _close(out, ref)


def test_model_forward_matches_and_result_does_not_depend_on_threads():
    model = randomize_tables(create_model("deit_small_patch16_224_ctx_product_50_shared_qkv")
                             .eval())
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    with torch.inference_mode():
        set_fused_attention("off")
        ref = model(x)
        set_fused_attention(None)
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(model(x))
    torch.set_num_threads(threads)
    _close(outs[0], ref)
    # per (b, h) pair the work is identical whatever thread runs it; the other layers' GEMMs
    # may change with the thread count, so compare the attention call itself bit for bit
    q, k, v = _qkv(4, 3, 197, 64)
    mods = _modules("product", "qkv", 1, 64)
    with torch.inference_mode():
        got = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            got.append(cl.library_attention(q, k, v, 0.125, *mods, None, None).clone())
    torch.set_num_threads(threads)
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])


@pytest.mark.parametrize("why", ["grad", "padding", "bias", "per_head", "float64", "cross"])
def test_other_calls_take_the_sdpa_path(why):
    """Training, DETR's padding mask, bias tables, per-head tables, other dtypes and cross
    tables are not the kernel's: the SDPA path answers them, equal to the unfused path."""
    method = "cross" if why == "cross" else "product"
    mods = _modules(method, "qkv" if why != "bias" else "qk", 1, 16,
                    shared=why != "per_head", mode="bias" if why == "bias" else "ctx")
    q, k, v = _qkv(2, 3, 10, 16)
    mask = None
    if why == "padding":
        mask = torch.zeros(2, 10, dtype=torch.bool)
        mask[1, -3:] = True
    if why == "float64":
        q, k, v = q.double(), k.double(), v.double()
        for m in mods:
            if m is not None:
                m.double()
    if why == "grad":
        q = q.detach().requires_grad_(True)
    assert not cl.library_supported(q, k, v, *mods, mask)
    ref = unfused_attention(q, k, v, 0.25, *mods, 3, 3, mask)
    out = rpe_attention(q, k, v, 0.25, *mods, 3, 3, mask)
    _close(out.detach(), ref.detach(), 2e-5)
    if why == "grad":  # the gradient flows (the kernel has none)
        out.sum().backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()


def test_torch_compile_traces_the_sdpa_path():
    """Under torch.compile (fake tensors, no data pointers) the kernel is not called."""
    mods = _modules("product", "qkv", 1, 16)
    q, k, v = _qkv(2, 3, 10, 16)
    ref = unfused_attention(q, k, v, 0.25, *mods, 3, 3)
    fn = torch.compile(lambda q, k, v: rpe_attention(q, k, v, 0.25, *mods, 3, 3),
                       backend="eager", fullgraph=False)
    with torch.inference_mode():
        _close(fn(q, k, v), ref)


def test_no_library_means_the_sdpa_path(tmp_path):
    mods = _modules("product", "k", 1, 16)
    q, k, v = _qkv(2, 3, 10, 16)
    ref = unfused_attention(q, k, v, 0.25, *mods, 3, 3)
    for path in (None, tmp_path / "missing.so"):
        cl.set_cpu_library(path)
        assert cl.cpu_library() is None
        with torch.inference_mode():
            assert not cl.library_supported(q, k, v, *mods, None)
            assert FLASH in _ops(lambda: rpe_attention(q, k, v, 0.25, *mods, 3, 3))
            _close(rpe_attention(q, k, v, 0.25, *mods, 3, 3), ref)
            with pytest.raises(RuntimeError, match="kernel is not loaded"):
                cl.library_attention(q, k, v, 0.25, None, mods[1], None, 3, 3)


def test_a_file_that_does_not_load_warns_once_and_falls_back(tmp_path):
    bad = tmp_path / "libirpe_cpu_attention.so"
    bad.write_bytes(b"not a shared object")
    cl.set_cpu_library(bad)
    with pytest.warns(UserWarning, match="not usable"):
        assert cl.cpu_library() is None
    assert cl.cpu_library() is None  # no second warning: the failure is remembered


def test_c_abi_refuses_bad_arguments(library):
    """A bad call is an error with a message, never a crash."""
    ids = torch.zeros(4, 4, dtype=torch.int64)
    out = torch.empty(4 * library.pad(4), dtype=torch.int32)
    assert library.pad(4) == 16 and library.pad(17) == 32
    with pytest.raises(RuntimeError, match="K >= 1|1 <= K"):
        library.check(library.ids(0, ids.data_ptr(), 4, 0, out.data_ptr()), "id table")
    with pytest.raises(RuntimeError, match="kind 0"):
        library.check(library.ids(7, ids.data_ptr(), 4, 3, out.data_ptr()), "id table")
    bad_q = (ids + 1).contiguous()  # a Q id that is not bucket-major (c * L + j)
    with pytest.raises(RuntimeError, match="bucket-major"):
        library.check(library.ids(1, bad_q.data_ptr(), 4, 3, out.data_ptr()), "id table")
    args = cl._Args(batch=1, heads=1, l=4, d=8, scale=1.0)  # no q, k, v, out
    with pytest.raises(RuntimeError, match="q, k, v and out are required"):
        library.check(library.run(ctypes.byref(args), 1), "iRPE attention")
    x = torch.zeros(1, 1, 4, 8)
    args = cl._Args(batch=1, heads=1, l=4, d=8, scale=1.0, q=x.data_ptr(), k=x.data_ptr(),
                    v=x.data_ptr(), out=x.data_ptr(), kk=3, wk=x.data_ptr())  # wk without ids
    with pytest.raises(RuntimeError, match="each term needs its weight, its ids"):
        library.check(library.run(ctypes.byref(args), 1), "iRPE attention")
    assert library.simd().decode() in ("avx512", "avx2", "portable")
