"""irpe::rpe_gather / irpe::rpe_scatter: values, dtypes, autograd, fake kernels, errors."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from irpe.ops import rpe_gather, rpe_scatter


def loop_gather(table, index):
    b, h, lq, _ = table.shape
    out = torch.empty(b, h, lq, index.shape[1], dtype=table.dtype)
    for i in range(lq):
        for j in range(index.shape[1]):
            out[:, :, i, j] = table[:, :, i, int(index[i, j])]
    return out


def loop_scatter(attn, index, k):
    b, h, lq, lk = attn.shape
    out = torch.zeros(b, h, lq, k, dtype=torch.float64)
    for i in range(lq):
        for j in range(lk):
            out[:, :, i, int(index[i, j])] += attn[:, :, i, j].double()
    return out


def make(dtype, index_dtype, b=2, h=3, lq=7, lk=9, k=5):
    table = torch.randn(b, h, lq, k).to(dtype)
    attn = torch.rand(b, h, lq, lk).to(dtype)
    index = torch.randint(0, k, (lq, lk), dtype=index_dtype)
    return table, attn, index, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_values_match_loops(dtype, index_dtype):
    table, attn, index, k = make(dtype, index_dtype)
    out = rpe_gather(table, index)
    assert out.dtype == dtype and out.shape == (2, 3, 7, 9)
    assert torch.equal(out, loop_gather(table, index))  # a gather is exact in every dtype
    s = rpe_scatter(attn, index, k)
    assert s.dtype == dtype and s.shape == (2, 3, 7, k)
    # fp32 accumulation: the only error left is the final rounding to the output dtype
    torch.testing.assert_close(s.double(), loop_scatter(attn, index, k), check_dtype=False,
                               rtol=torch.finfo(dtype).eps * 2, atol=0)


def test_gradcheck_both_ops():
    table, attn, index, k = make(torch.float64, torch.int64)
    table.requires_grad_(True)
    attn.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: rpe_gather(t, index), (table,))
    assert torch.autograd.gradcheck(lambda a: rpe_scatter(a, index, k), (attn,))
    assert torch.autograd.gradgradcheck(lambda t: rpe_gather(t, index), (table,))


def test_backward_of_gather_is_scatter_and_vice_versa():
    table, attn, index, k = make(torch.float32, torch.int32)
    table.requires_grad_(True)
    rpe_gather(table, index).backward(attn)
    torch.testing.assert_close(table.grad, rpe_scatter(attn, index, k))
    a = attn.clone().requires_grad_(True)
    g = torch.randn(2, 3, 7, k)
    rpe_scatter(a, index, k).backward(g)
    torch.testing.assert_close(a.grad, rpe_gather(g, index))


def test_broadcast_batch_and_expanded_table():
    table = torch.randn(1, 3, 4, 6).expand(5, 3, 4, 6)  # stride-0 batch
    index = torch.randint(0, 6, (4, 4))
    assert torch.equal(rpe_gather(table, index), loop_gather(table.contiguous(), index))


def test_one_row_table_is_broadcast_over_queries():
    """A (B,H,1,K) table serves every query row of the index; backward sums over them."""
    table = torch.randn(2, 3, 1, 12, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 12, (5, 7))
    out = rpe_gather(table, index)
    assert out.shape == (2, 3, 5, 7)
    assert torch.equal(out, loop_gather(table.detach().expand(2, 3, 5, 12), index))
    torch.autograd.gradcheck(lambda t: rpe_gather(t, index), (table,))
    grad = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    out.backward(grad)
    expected = loop_scatter(grad, index, 12).sum(2, keepdim=True)
    torch.testing.assert_close(table.grad, expected)
    with pytest.raises(ValueError, match="Lq mismatch"):
        rpe_gather(torch.randn(2, 3, 2, 12), index)  # 2 rows for 5 queries
    with pytest.raises(ValueError, match="Lq mismatch"):
        rpe_scatter(torch.rand(2, 3, 1, 7), index, 12)  # no broadcast for the scatter


def test_opcheck_registration():
    table, attn, index, k = make(torch.float32, torch.int64)
    torch.library.opcheck(torch.ops.irpe.rpe_gather.default, (table.requires_grad_(), index))
    torch.library.opcheck(torch.ops.irpe.rpe_scatter.default, (attn.requires_grad_(), index, k))


def test_fake_kernels_give_shapes_without_data():
    with FakeTensorMode():
        table = torch.empty(2, 4, 50, 13)
        attn = torch.empty(2, 4, 50, 60)
        index = torch.empty(50, 60, dtype=torch.int32)
        assert rpe_gather(table, index).shape == (2, 4, 50, 60)
        assert rpe_scatter(attn, index, 13).shape == (2, 4, 50, 13)
    meta = rpe_gather(torch.empty(1, 2, 3, 4, device="meta"),
                      torch.empty(3, 5, dtype=torch.int64, device="meta"))
    assert meta.shape == (1, 2, 3, 5) and meta.device.type == "meta"


def test_bad_inputs_raise_clear_errors():
    table, attn, index, k = make(torch.float32, torch.int64)
    with pytest.raises(ValueError, match="4-D"):
        rpe_gather(table[0], index)
    with pytest.raises(ValueError, match="int32/int64"):
        rpe_gather(table, index.float())
    with pytest.raises(ValueError, match="Lq mismatch"):
        rpe_gather(table, index[:3])
    with pytest.raises(ValueError, match="Lk mismatch"):
        rpe_scatter(attn, index[:, :4], k)
    with pytest.raises(ValueError, match="unsupported dtype"):
        rpe_gather(table.to(torch.int32), index)
