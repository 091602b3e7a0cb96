"""Bucket index math against hand-computed tables and an independent scalar reference."""
import pytest
import torch
from reference import bucket_table

from irpe.bucket import (
    Method,
    bucket_ids,
    bucket_ids_traceable,
    coefficients,
    num_buckets,
    parse_method,
    piecewise_index,
    relative_offsets,
)

# ratio 1.9: alpha 1.9, beta 3.8, gamma 15.2, ln(gamma/alpha) = ln 8.
#  |x|=2: 1.9 + ln(2/1.9)/ln8*1.9 = 1.947 -> 2;  3: 2.317 -> 2;  4: 2.580 -> 3;
#  13: 3.657 -> round 4 -> clip 3.8 -> int 3.  So 7 values per axis, 7*7 = 49 buckets + cls = 50.
HAND_1_9 = [0, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]
# ratio 2.0: alpha 2, beta 4, gamma 16.  3: 2.39 -> 2; 4: 2.667 -> 3; 9: 3.447 -> 3;
#  10: 3.548 -> 4; 16: 4.0 -> 4.  9 values per axis -> 81 buckets (DETR rpe-2.0-product, [1,32,81]).
HAND_2_0 = [0, 1, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4]


@pytest.mark.parametrize("ratio,expected", [(1.9, HAND_1_9), (2.0, HAND_2_0)])
def test_piecewise_hand_tables(ratio, expected):
    x = torch.arange(len(expected))
    assert piecewise_index(x, ratio).tolist() == expected
    assert piecewise_index(-x, ratio).tolist() == [-v for v in expected]
    assert piecewise_index(x.float(), ratio).tolist() == expected  # float input path


def test_piecewise_rounds_half_to_even_inside_alpha():
    # |x| <= alpha keeps x, rounded half-to-even for float inputs (torch.round semantics)
    out = piecewise_index(torch.tensor([0.5, 1.5, 2.5, -2.5, 3.49]), ratio=4.0)
    assert out.tolist() == [0, 2, 2, -2, 3]
    assert out.dtype == torch.int64


def test_coefficients():
    c = coefficients(1.9)
    assert (c.alpha, c.beta, c.gamma, c.beta_int) == (1.9, 3.8, 1.9 * 8, 3)
    with pytest.raises(ValueError):
        coefficients(0)


def test_bucket_counts_deit_names():
    # allocated per table, 14x14 + cls: product 1.9 -> 50, euc 20 -> 82, quant 33 -> 134,
    # cross 20 -> 82 per direction
    assert num_buckets("product", 1.9, skip=1) == 50
    assert num_buckets("euc", 20, skip=1) == 82
    assert num_buckets("quant", 33, skip=1) == 134
    assert num_buckets("cross", 20, skip=1) == 82
    assert num_buckets("product", 2.0, skip=0) == 81


def test_bucket_counts_used_match_model_names():
    used = lambda m, r: bucket_ids(m, r, 14, 14, skip=1).unique().numel()  # noqa: E731
    assert used("product", 1.9) == 50  # _product_50
    assert used("euc", 20) == 20  # _euc_20
    assert used("quant", 33) == 51  # _quant_51
    assert used("cross_rows", 20) + used("cross_cols", 20) == 56  # _cross_56


def test_product_hand_table_with_cls():
    ids = bucket_ids("product", 1.9, 3, 3, skip=1)
    assert ids.shape == (10, 10)
    # centre query (1,1) = token 5 (after cls); id = (dr+3)*7 + (dc+3), dr = q - k
    assert ids[5, 1:].tolist() == [32, 31, 30, 25, 24, 23, 18, 17, 16]
    assert (ids[0, :] == 49).all() and (ids[:, 0] == 49).all()  # cls row/col, cls<->cls too
    assert ids[1:, 1:].max() < 49


def test_skip_two_tokens_share_one_extra_bucket():
    ids = bucket_ids("euc", 20, 4, 5, skip=2)
    assert ids.shape == (22, 22)
    extra = num_buckets("euc", 20)
    assert (ids[:2] == extra).all() and (ids[:, :2] == extra).all()
    assert ids[2:, 2:].max() < extra


def test_offsets_row_major_query_minus_key():
    diff = relative_offsets(2, 3)
    assert diff.shape == (6, 6, 2)
    assert diff[5, 0].tolist() == [1, 2]  # query (1,2) - key (0,0)
    assert diff[0, 5].tolist() == [-1, -2]


METHODS = [("product", 1.9), ("product", 2.0), ("euc", 20), ("euc", 1.9), ("quant", 33),
           ("quant", 2.0), ("cross_rows", 20), ("cross_cols", 20), ("cross_rows", 1.9),
           ("cross_cols", 2.5)]
GRIDS = [(1, 1), (3, 3), (5, 7), (7, 5), (2, 11), (14, 14), (9, 4)]


@pytest.mark.parametrize("method,ratio", METHODS)
@pytest.mark.parametrize("skip", [0, 1, 2])
def test_cached_equals_traceable_and_reference(method, ratio, skip):
    extra = num_buckets(method, ratio)
    for h, w in GRIDS:
        cached = bucket_ids(method, ratio, h, w, skip)
        traced = bucket_ids_traceable(method, ratio, h, w, skip)
        assert cached.dtype == traced.dtype == torch.int64
        assert torch.equal(cached, traced), (h, w)
        if h * w <= 35:
            assert torch.equal(cached, bucket_table(method, ratio, h, w, skip, extra)), (h, w)


def test_cached_ids_are_cached():
    assert bucket_ids("product", 1.9, 6, 4, 1) is bucket_ids("product", 1.9, 6, 4, 1)


def test_traceable_ids_follow_dynamic_sizes_in_a_traced_graph():
    def fn(h, w):
        return bucket_ids_traceable("product", 2.0, h, w, skip=0)

    traced = torch.jit.trace(fn, (torch.tensor(4), torch.tensor(6)), check_trace=False)
    for h, w in [(4, 6), (3, 9), (12, 5)]:
        assert torch.equal(traced(torch.tensor(h), torch.tensor(w)),
                           bucket_ids("product", 2.0, h, w, 0))


def test_method_aliases_and_errors():
    assert parse_method("EUC") is Method.EUCLIDEAN
    assert parse_method(3) is Method.PRODUCT and parse_method(0) is Method.EUCLIDEAN
    with pytest.raises(ValueError, match="unknown iRPE method"):
        parse_method("polar")
    with pytest.raises(ValueError, match="no single bucket map"):
        bucket_ids("cross", 20, 3, 3)
    with pytest.raises(ValueError, match="at least 1x1"):
        bucket_ids("product", 1.9, 0, 3)
    with pytest.raises(ValueError, match="skip"):
        bucket_ids("product", 1.9, 3, 3, skip=-1)
