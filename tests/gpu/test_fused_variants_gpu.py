"""A smoke launch of every fused-kernel variant family in every dtype (tools.fused_variants) on
the GPU, compiled by Triton: a failure names the variant (test id <family>-<dtype>).
`make gpu-check` runs this file as its Triton probe."""
import importlib.util

import pytest
import torch

from tests.gpu.variant_smoke import smoke
from tools.fused_variants import variants

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton missing"),
]


@pytest.mark.parametrize("variant", variants(), ids=lambda v: v.name)
def test_variant_smoke(variant):
    if variant.dtype == "bf16" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 Triton dots need sm_80+")
    smoke(variant, "cuda")
