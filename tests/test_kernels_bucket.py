"""The kernels' bucket-id math (plugins/kernels/irpe_bucket.h), compiled for the host, equals
irpe.bucket.bucket_ids: the same __host__ __device__ functions the CUDA kernels run."""
import random
import re
import shutil

import pytest
import torch

from irpe.bucket import METHOD_IDS, Method, bucket_ids, num_buckets
from tools import kernels_capi

METHODS = ["euc", "quant", "product", "cross_rows", "cross_cols"]

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="no host C compiler (gcc)")


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    return kernels_capi.KernelLibrary(
        kernels_capi.build_host_library(tmp_path_factory.mktemp("host")))


def host_ids(lib, method, ratio, h, w, skip):
    return lib.bucket_ids_host(lib.make_params(method, ratio, h, w, skip)).long()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("skip", [0, 1])
def test_host_ids_equal_bucket_ids(host_lib, method, skip):
    # official ratios (1.9 product, 20 euc/cross, 33 quant, 2.0 DETR) and a few others;
    # square, non-square and degenerate grids
    for ratio in (0.5, 1.9, 2.0, 3.7, 20, 33):
        for h, w in ((1, 1), (14, 14), (5, 9), (13, 4), (1, 7)):
            expected = bucket_ids(method, ratio, h, w, skip)
            got = host_ids(host_lib, method, ratio, h, w, skip)
            assert torch.equal(got, expected), (method, ratio, h, w, skip)


def test_host_ids_detr_sized_grid(host_lib):
    """A DETR-like 25x38 feature map (950 tokens), where log-branch rounding happens often."""
    for method, ratio in (("product", 2.0), ("euc", 2.0), ("quant", 33)):
        assert torch.equal(host_ids(host_lib, method, ratio, 25, 38, 0),
                           bucket_ids(method, ratio, 25, 38, 0))


def test_host_ids_random_ratios(host_lib):
    """Many ratios with many digits hit float32 rounding boundaries of the log branch."""
    rng = random.Random(5)
    ratios = [round(rng.uniform(0.2, 40), rng.choice([1, 2, 3, 6])) for _ in range(40)]
    for ratio in ratios:
        for method in METHODS:
            assert torch.equal(host_ids(host_lib, method, ratio, 12, 17, 1),
                               bucket_ids(method, ratio, 12, 17, 1)), (method, ratio)


# (method, ratio, H, W): the float32 log branch lands exactly on n + 0.5 for some offset (e.g.
# ratio 9.8043, |dr| = 62 -> 18.5, kept by half-to-even, 19 with half-away rounding) or within
# 1e-6 of it (ratio 4.1661, |dr| = 22 -> 7.5 in float32, 7.4999995 in double): a double-precision
# or differently rounded formula fails here (checked by mutating the header).
BOUNDARY_CASES = [("cross_rows", 4.1661, 23, 1), ("cross_rows", 9.8043, 63, 1),
                  ("product", 11.7582, 17, 3), ("cross_cols", 12.9159, 1, 24),
                  ("euc", 4.1661, 20, 20)]


@pytest.mark.parametrize("method,ratio,h,w", BOUNDARY_CASES)
def test_host_ids_at_rounding_boundaries(host_lib, method, ratio, h, w):
    assert torch.equal(host_ids(host_lib, method, ratio, h, w, 0),
                       bucket_ids(method, ratio, h, w, 0))


def test_params_match_python_coefficients(host_lib):
    p = host_lib.make_params("product", 1.9, 14, 14, 1)
    assert (p.method, p.height, p.width, p.skip) == (3, 14, 14, 1)
    assert p.beta_int == 3 and p.extra == 49 and p.num_buckets == num_buckets("product", 1.9, 1)
    assert p.alpha == pytest.approx(1.9) and p.beta == pytest.approx(3.8)
    assert p.log_ratio == pytest.approx(2.0794415)  # ln(8)
    for method in METHODS:
        for ratio, skip in ((20, 1), (33, 0), (2.0, 0)):
            assert host_lib.make_params(method, ratio, 3, 3, skip).num_buckets == \
                num_buckets(method, ratio, skip)


@pytest.mark.parametrize("args", [("cross", 2.0, 3, 3, 0), ("product", 0.0, 3, 3, 0),
                                  ("product", -1.0, 3, 3, 0), ("euc", 2.0, 0, 3, 0),
                                  ("euc", 2.0, 3, 0, 0), ("quant", 2.0, 3, 3, -1)])
def test_bad_params_raise(host_lib, args):
    with pytest.raises(ValueError):
        host_lib.make_params(*args)


def test_bucket_ids_host_rejects_null(host_lib):
    assert host_lib.call("irpe_bucket_ids_host", None, None) == 1


def test_header_method_ids_are_the_official_ones():
    """IRPE_METHOD_* in the header equal irpe.bucket.METHOD_IDS (the official numeric ids)."""
    text = (kernels_capi.KERNEL_DIR / "irpe_bucket.h").read_text()
    found = {name.lower(): int(v) for name, v in re.findall(r"IRPE_METHOD_(\w+) = (\d+)", text)}
    names = {"euclidean": Method.EUCLIDEAN, "quant": Method.QUANT, "product": Method.PRODUCT,
             "cross_rows": Method.CROSS_ROWS, "cross_cols": Method.CROSS_COLS}
    assert set(found) == set(names)
    for name, value in found.items():
        assert METHOD_IDS[names[name]] == value and kernels_capi.METHOD_IDS[names[name]] == value
