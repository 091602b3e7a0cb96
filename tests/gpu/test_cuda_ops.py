"""CUDA kernels (plugins/kernels via plugins/pytorch) against the CPU reference of irpe.ops.

Needs a CUDA device and a CUDA build of torch + nvcc (the extension is JIT-built once, cached).
Shapes go from tiny and odd ones through DeiT (197 tokens) to DETR-sized (>= 2000 tokens)."""
import pytest
import torch

import plugins.pytorch as irpe_cuda
from irpe.bucket import bucket_ids, num_buckets
from irpe.ops import rpe_gather, rpe_scatter

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]
# (B, H, method, ratio, grid H, grid W, skip): Lq = Lk = skip + H*W tokens
SHAPES = {
    "one_token": (1, 1, "product", 1.9, 1, 1, 0),
    "odd": (3, 5, "euc", 2.0, 3, 4, 1),            # Lk = 13: scalar (unaligned) path
    "aligned": (2, 3, "quant", 33, 8, 8, 0),       # Lk = 64: 16-byte vector path
    "deit": (2, 6, "product", 1.9, 14, 14, 1),     # 197 tokens, 50 buckets
    "detr": (1, 8, "product", 2.0, 43, 50, 0),     # 2150 tokens, 81 buckets
}
MIN_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.fixture(scope="module", autouse=True)
def cuda_ops():
    reason = irpe_cuda.unavailable_reason()
    if reason:
        pytest.skip(reason)
    irpe_cuda.register()
    return irpe_cuda.load()


def make(shape, dtype, index_dtype, index_kind="grid", seed=0):
    b, h, method, ratio, gh, gw, skip = SHAPES[shape]
    g = torch.Generator().manual_seed(seed)
    k = num_buckets(method, ratio, skip)
    ids = bucket_ids(method, ratio, gh, gw, skip)
    if index_kind == "random":  # no runs of equal ids, buckets repeat all over each row
        ids = torch.randint(0, k, ids.shape, generator=g)
    lq = ids.shape[0]
    table = torch.randn(b, h, lq, k, generator=g).to(dtype)
    attn = torch.rand(b, h, lq, lq, generator=g).softmax(-1).to(dtype)
    return table, attn, ids.to(index_dtype), k


def scatter_reference(attn, ids, k):
    """fp64 sums on the CPU (the op's CPU path in float64)."""
    return rpe_scatter(attn.double(), ids.long(), k)


def assert_scatter_close(got, attn, ids, k):
    tol = MIN_TOL[attn.dtype]
    torch.testing.assert_close(got.cpu().double(), scatter_reference(attn, ids, k),
                               rtol=tol, atol=tol)


ALL_CASES = pytest.mark.parametrize("shape,dtype,index_dtype", [
    (s, d, i) for s in SHAPES for d in DTYPES for i in INDEX_DTYPES])


@ALL_CASES
def test_gather_is_exact(shape, dtype, index_dtype):
    for kind in ("grid", "random"):
        table, _, ids, _ = make(shape, dtype, index_dtype, kind)
        got = rpe_gather(table.cuda(), ids.cuda())
        assert got.dtype == dtype and got.is_cuda
        assert torch.equal(got.cpu(), rpe_gather(table, ids)), kind


@ALL_CASES
def test_scatter_matches_fp64_reference(shape, dtype, index_dtype):
    for kind in ("grid", "random"):
        _, attn, ids, k = make(shape, dtype, index_dtype, kind)
        got = rpe_scatter(attn.cuda(), ids.cuda(), k)
        assert got.dtype == dtype and got.shape == attn.shape[:3] + (k,)
        assert_scatter_close(got, attn, ids, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_is_bitwise_deterministic(dtype):
    _, attn, ids, k = make("detr", dtype, torch.int64)
    attn, ids = attn.cuda(), ids.cuda()
    first = rpe_scatter(attn, ids, k)
    for _ in range(3):
        assert torch.equal(rpe_scatter(attn, ids, k), first)


def test_strided_inputs():
    table, attn, ids, k = make("deit", torch.float32, torch.int64)
    table, attn, ids = table.cuda(), attn.cuda(), ids.cuda()
    broadcast = table[:1].expand(4, -1, -1, -1)               # stride 0 over B
    transposed = table.transpose(2, 3).contiguous().transpose(2, 3)  # last-dim stride != 1
    for t in (broadcast, transposed, table[:, ::2]):
        assert torch.equal(rpe_gather(t, ids).cpu(), rpe_gather(t.cpu(), ids.cpu()))
    wide = torch.zeros(*attn.shape[:3], attn.shape[3] + 3, device="cuda")
    wide[..., 1:-2] = attn
    sliced = wide[..., 1:-2]                                    # unaligned rows
    assert_scatter_close(rpe_scatter(sliced, ids, k), attn.cpu(), ids.cpu(), k)


def test_large_grid_stride():
    """Many more tasks than blocks launched: the grid-stride loops cover everything."""
    b, h, lq, lk, k = 1, 1, 70000, 5, 3
    table = torch.randn(b, h, lq, k, device="cuda")
    ids = torch.randint(0, k, (lq, lk), device="cuda")
    assert torch.equal(rpe_gather(table, ids).cpu(), rpe_gather(table.cpu(), ids.cpu()))
    attn = torch.rand(b, h, lq, lk, device="cuda")
    assert_scatter_close(rpe_scatter(attn, ids, k), attn.cpu(), ids.cpu(), k)


def test_out_of_range_ids_are_ignored():
    table = torch.randn(1, 2, 3, 4, device="cuda")
    ids = torch.tensor([[0, 4, -1], [3, 3, 9], [1, 2, 0]], device="cuda")
    out = rpe_gather(table, ids)
    assert torch.equal(out[:, :, 0, 1], torch.zeros(1, 2, device="cuda"))
    assert torch.equal(out[:, :, 0, 0], table[:, :, 0, 0])
    s = rpe_scatter(torch.ones(1, 2, 3, 3, device="cuda"), ids, 4)
    assert s[0, 0, 1].tolist() == [0.0, 0.0, 0.0, 2.0]


def test_huge_bucket_count_uses_the_scan_kernel():
    k = 5000  # > shared-memory budget for per-warp sums
    attn = torch.rand(2, 2, 9, 300, device="cuda")
    ids = torch.randint(0, k, (9, 300), device="cuda")
    assert_scatter_close(rpe_scatter(attn, ids, k), attn.cpu(), ids.cpu(), k)
    table = torch.randn(2, 2, 9, 9000, device="cuda")  # table row > shared memory: unstaged
    ids = torch.randint(0, 9000, (9, 300), device="cuda")
    assert torch.equal(rpe_gather(table, ids).cpu(), rpe_gather(table.cpu(), ids.cpu()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_backward_on_cuda(dtype):
    table, attn, ids, k = make("deit", dtype, torch.int64)
    t_gpu = table.cuda().requires_grad_(True)
    a_gpu = attn.cuda().requires_grad_(True)
    t_cpu = table.clone().requires_grad_(True)
    a_cpu = attn.clone().requires_grad_(True)
    g_out = torch.randn(attn.shape).to(dtype)
    g_buckets = torch.randn(table.shape).to(dtype)
    rpe_gather(t_gpu, ids.cuda()).backward(g_out.cuda())
    rpe_gather(t_cpu, ids).backward(g_out)
    rpe_scatter(a_gpu, ids.cuda(), k).backward(g_buckets.cuda())
    rpe_scatter(a_cpu, ids, k).backward(g_buckets)
    tol = MIN_TOL[dtype] * 4
    torch.testing.assert_close(t_gpu.grad.cpu(), t_cpu.grad, rtol=tol, atol=tol)
    assert torch.equal(a_gpu.grad.cpu(), a_cpu.grad)  # a gather: exact


def test_float64_falls_back_to_torch():
    table, attn, ids, k = make("odd", torch.float64, torch.int64)
    assert torch.equal(rpe_gather(table.cuda(), ids.cuda()).cpu(), rpe_gather(table, ids))
    torch.testing.assert_close(rpe_scatter(attn.cuda(), ids.cuda(), k).cpu(),
                               scatter_reference(attn, ids, k))


@pytest.mark.parametrize("method", ["euc", "quant", "product", "cross_rows", "cross_cols"])
@pytest.mark.parametrize("skip", [0, 1])
def test_on_the_fly_ids_equal_index_tensor(method, skip):
    for ratio, gh, gw in ((1.9, 14, 14), (2.0, 7, 11), (20, 5, 3)):
        ids = bucket_ids(method, ratio, gh, gw, skip)
        assert torch.equal(irpe_cuda.bucket_ids(method, ratio, gh, gw, skip).cpu().long(), ids)
        k = num_buckets(method, ratio, skip)
        lq = ids.shape[0]
        table = torch.randn(2, 3, lq, k, device="cuda")
        attn = torch.rand(2, 3, lq, lq, device="cuda")
        assert torch.equal(irpe_cuda.gather_grid(table, method, ratio, gh, gw, skip),
                           rpe_gather(table, ids.cuda()))
        assert_scatter_close(irpe_cuda.scatter_grid(attn, method, ratio, gh, gw, skip),
                             attn.cpu(), ids, k)


@pytest.mark.parametrize("method,ratio,h,w", [
    ("cross_rows", 4.1661, 23, 1), ("cross_rows", 9.8043, 63, 1), ("product", 11.7582, 17, 3),
    ("cross_cols", 12.9159, 1, 24), ("euc", 4.1661, 20, 20)])
def test_device_ids_at_float32_rounding_boundaries(method, ratio, h, w):
    """Cases where the log branch lands on (or within 1e-6 of) n + 0.5 in float32."""
    assert torch.equal(irpe_cuda.bucket_ids(method, ratio, h, w, 0).cpu().long(),
                       bucket_ids(method, ratio, h, w, 0))
