"""irpe.precision: the one precision-name -> torch dtype table (serve's torch backend and the
benchmarks import it) and its clear refusal of unknown names."""
import pytest
import torch

from irpe.precision import PRECISION_DTYPES, PRECISIONS, torch_dtype


def test_names_map_to_dtypes():
    assert PRECISIONS == ("fp32", "fp16", "bf16")
    assert [torch_dtype(p) for p in PRECISIONS] == [torch.float32, torch.float16, torch.bfloat16]
    assert set(PRECISION_DTYPES) == set(PRECISIONS)


@pytest.mark.parametrize("bad", ["fp64", "FP16", "", None, 16])
def test_unknown_precision_is_a_clear_value_error(bad):
    with pytest.raises(ValueError, match=r"unknown precision .*expected one of fp32, fp16, bf16"):
        torch_dtype(bad)


def test_users_share_the_table():
    """serve's torch backend and the benchmarks hold no dtype table of their own."""
    import benchmarks.attention_bench as attention_bench
    import benchmarks.models_bench as models_bench
    import serve.backends.torch_backend as torch_backend
    for module in (attention_bench, models_bench, torch_backend):
        assert not hasattr(module, "DTYPES"), module.__name__
        assert module.torch_dtype is torch_dtype
    assert models_bench.PRECISIONS is PRECISIONS
