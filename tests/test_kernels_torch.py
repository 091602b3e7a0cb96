"""The PyTorch CUDA-ops loader (plugins/pytorch): clear refusal on a CPU-only torch, argument
errors before anything is built, and the CPU path of irpe.ops untouched."""
import pytest
import torch

import plugins.pytorch as irpe_cuda
from irpe.ops import rpe_gather, rpe_scatter

cpu_torch = pytest.mark.skipif(torch.version.cuda is not None,
                               reason="this torch is a CUDA build: tests/gpu covers the ops")


@cpu_torch
def test_cpu_torch_is_refused_with_a_reason():
    reason = irpe_cuda.unavailable_reason()
    assert "CPU-only build" in reason and torch.__version__ in reason
    with pytest.raises(irpe_cuda.CudaOpsUnavailable, match="CPU-only build"):
        irpe_cuda.load()
    with pytest.raises(irpe_cuda.CudaOpsUnavailable):
        irpe_cuda.register()
    assert not irpe_cuda.is_registered()


@cpu_torch
def test_cpu_ops_unchanged_after_refused_register():
    table = torch.randn(2, 3, 4, 5)
    index = torch.randint(0, 5, (4, 6))
    before = rpe_gather(table, index), rpe_scatter(torch.rand(2, 3, 4, 6), index, 5)
    with pytest.raises(irpe_cuda.CudaOpsUnavailable):
        irpe_cuda.register()
    assert torch.equal(rpe_gather(table, index), before[0])
    assert torch.equal(torch.gather(table, 3, index.expand(2, 3, 4, 6)), before[0])


def test_missing_nvcc_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(irpe_cuda, "nvcc_path", lambda: None)
    assert "nvcc not found" in irpe_cuda.unavailable_reason()


@pytest.mark.parametrize("call,match", [
    (lambda: irpe_cuda.gather_grid(torch.zeros(1, 1, 5, 3), "product", 1.9, 2, 2, 0),
     "skip \\+ H\\*W = 4"),
    (lambda: irpe_cuda.gather_grid(torch.zeros(1, 5, 3), "product", 1.9, 2, 2, 1), "4-D"),
    (lambda: irpe_cuda.scatter_grid(torch.zeros(1, 1, 5, 3), "euc", 2.0, 2, 2, 1),
     "self-attention only"),
    (lambda: irpe_cuda.gather_grid(torch.zeros(1, 1, 1, 3), "euc", 2.0, 0, 2, 1), "at least 1x1"),
    (lambda: irpe_cuda.bucket_ids("cross", 2.0, 3, 3), "cross_rows/cols"),
    (lambda: irpe_cuda.bucket_ids("nope", 2.0, 3, 3), "unknown iRPE method"),
    (lambda: irpe_cuda._gather_cuda(torch.zeros(2, 3, 4), torch.zeros(4, 4, dtype=torch.long)),
     "4-D"),
    (lambda: irpe_cuda._scatter_cuda(torch.zeros(1, 1, 4, 5), torch.zeros(4, 6, dtype=torch.long),
                                     3), "Lk mismatch"),
    (lambda: irpe_cuda._gather_cuda(torch.zeros(1, 1, 4, 5), torch.zeros(4, 4)), "int32/int64"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@cpu_torch
def test_valid_grid_call_on_cpu_torch_names_the_reason():
    with pytest.raises(irpe_cuda.CudaOpsUnavailable, match="CPU-only"):
        irpe_cuda.gather_grid(torch.zeros(1, 1, 5, 50), "product", 1.9, 2, 2, 1)
