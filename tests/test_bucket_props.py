"""Hypothesis properties of the bucket index math (irpe/bucket.py) over random method, ratio,
grid and skip: the two implementations agree, ids stay in range, the symmetries of each method
hold, skip tokens share one bucket, and the piecewise index is odd, monotone and bounded."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from irpe.bucket import bucket_ids, bucket_ids_traceable, coefficients, num_buckets, piecewise_index

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)
METHODS = ("euc", "quant", "product", "cross_rows", "cross_cols")
ratios = st.floats(0.3, 40.0, allow_nan=False).map(lambda r: round(r, 2))
grids = st.tuples(st.integers(1, 9), st.integers(1, 9))


@SETTINGS
@given(st.sampled_from(METHODS), ratios, grids, st.integers(0, 2))
def test_cached_equals_traceable_and_in_range(method, ratio, grid, skip):
    cached = bucket_ids(method, ratio, *grid, skip=skip)
    traced = bucket_ids_traceable(method, ratio, *grid, skip=skip)
    assert cached.dtype == traced.dtype == torch.int64
    assert torch.equal(cached, traced)
    side = skip + grid[0] * grid[1]
    assert cached.shape == (side, side)
    assert cached.min() >= 0 and cached.max() < num_buckets(method, ratio, skip)


@SETTINGS
@given(st.sampled_from(METHODS), ratios, grids)
def test_reversed_offset_maps_to_mirrored_bucket(method, ratio, grid):
    ids = bucket_ids(method, ratio, *grid)
    b = coefficients(ratio).beta_int
    if method in ("euc", "quant"):  # distances: symmetric
        assert torch.equal(ids, ids.T)
    elif method == "product":  # (r, c) -> (2b - r, 2b - c)
        r, c = ids // (2 * b + 1), ids % (2 * b + 1)
        assert torch.equal(r.T, 2 * b - r) and torch.equal(c.T, 2 * b - c)
    else:  # one signed offset: id -> 2b - id
        assert torch.equal(ids.T, 2 * b - ids)


@SETTINGS
@given(st.sampled_from(METHODS), ratios, grids, st.integers(1, 3))
def test_skip_tokens_all_map_to_the_one_extra_bucket(method, ratio, grid, skip):
    ids = bucket_ids(method, ratio, *grid, skip=skip)
    extra = num_buckets(method, ratio, skip=0)
    assert num_buckets(method, ratio, skip=skip) == extra + 1
    assert (ids[:skip] == extra).all() and (ids[:, :skip] == extra).all()
    assert torch.equal(ids[skip:, skip:], bucket_ids(method, ratio, *grid))
    assert ids[skip:, skip:].max() < extra


@SETTINGS
@given(ratios, st.lists(st.integers(-10_000, 10_000), min_size=1, max_size=64))
def test_piecewise_is_odd_monotone_and_bounded_on_integers(ratio, values):
    x = torch.tensor(sorted(values))
    y = piecewise_index(x, ratio)
    assert torch.equal(piecewise_index(-x, ratio), -y)
    assert (y[1:] >= y[:-1]).all()
    assert y.abs().max() <= coefficients(ratio).beta_int
    assert torch.equal(piecewise_index(x.double(), ratio), y)  # float path, integral values


@SETTINGS
@given(ratios, st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=64))
def test_piecewise_is_odd_monotone_and_bounded_on_floats(ratio, values):
    x = torch.tensor(sorted(values), dtype=torch.float64)
    y = piecewise_index(x, ratio)
    assert torch.equal(piecewise_index(-x, ratio), -y)  # round half-to-even is odd too
    assert (y[1:] >= y[:-1]).all()
    assert y.abs().max() <= coefficients(ratio).beta_int
