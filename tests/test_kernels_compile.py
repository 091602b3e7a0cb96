"""nvcc compiles every CUDA kernel for sm_75/80/86/89/90 (+ compute_90 PTX) in one call; the
linked library exports the C ABI and rejects bad calls with IRPE_ERR_ARGUMENT before launching.

Runs on the CPU CI machines (nvcc, no GPU); skipped only where nvcc is absent."""
import ctypes
import re

import pytest
import torch

from irpe.bucket import bucket_ids
from tools import kernels_capi

pytestmark = pytest.mark.skipif(kernels_capi.nvcc_path() is None,
                                reason="nvcc not found (CUDA toolkit not installed): "
                                       "the kernels cannot be compiled on this machine")

KERNELS = ("gather_kernel", "scatter_kernel", "scatter_scan_kernel", "bucket_ids_kernel")
DUMMY = ctypes.c_void_p(256)  # never dereferenced: every call below fails before any launch


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    lib_path, log = kernels_capi.build_kernels_library(tmp_path_factory.mktemp("kernels"))
    return kernels_capi.KernelLibrary(lib_path), log


def problem(b=2, h=3, lq=5, lk=5, k=7):
    p = kernels_capi.Problem(b, h, lq, lk, k)
    p.stride[:] = [h * lq * k, lq * k, k, 1]
    return p


def test_every_kernel_compiles_for_every_arch(built):
    _, log = built
    assert "warning" not in log.lower(), log
    for arch in kernels_capi.ARCHS:
        compiled = set(re.findall(rf"Compiling entry function '\w*?(\d+{'|'.join(KERNELS)})\w*' "
                                  rf"for 'sm_{arch}'", log))
        names = {re.sub(r"^\d+", "", name) for name in compiled}
        assert names == set(KERNELS), (arch, names)


def test_library_exports_the_c_abi(built):
    lib, _ = built
    header = (kernels_capi.KERNEL_DIR / "irpe_kernels.h").read_text()
    declared = re.findall(r"IRPE_API [\w\s\*]+?\b(irpe_\w+)\(", header)
    assert len(declared) >= 9
    for name in declared:
        assert hasattr(lib.lib, name), name


def test_full_library_host_math(built):
    lib, _ = built
    ids = lib.bucket_ids_host(lib.make_params("product", 2.0, 9, 13, 0)).long()
    assert torch.equal(ids, bucket_ids("product", 2.0, 9, 13, 0))


def _gather(lib, prob, dtype=0, index_dtype=0, table=DUMMY, index=DUMMY, out=DUMMY):
    return lib.call("irpe_gather", ctypes.byref(prob) if prob is not None else None,
                    dtype, table, index_dtype, index, out, None)


def _scatter_grid(lib, prob, params, attn=DUMMY, out=DUMMY):
    return lib.call("irpe_scatter_grid", ctypes.byref(prob), 0, attn,
                    ctypes.byref(params) if params is not None else None, out, None)


def test_bad_arguments_are_rejected_without_launch(built):
    lib, _ = built
    assert _gather(lib, None) == 1
    assert _gather(lib, problem(b=0)) == 1
    assert _gather(lib, problem(k=0)) == 1
    assert _gather(lib, problem(), table=None) == 1
    assert _gather(lib, problem(), index=None) == 1
    assert _gather(lib, problem(), out=None) == 1
    assert _gather(lib, problem(), dtype=7) == 1
    assert _gather(lib, problem(), index_dtype=5) == 1
    negative = problem()
    negative.stride[1] = -1
    assert _gather(lib, negative) == 1
    params = lib.make_params("product", 1.9, 2, 2, 1)  # 5 tokens
    assert _scatter_grid(lib, problem(lq=5, lk=5), None) == 1
    assert _scatter_grid(lib, problem(lq=6, lk=6), params) == 1  # grid does not give 6 tokens
    assert _scatter_grid(lib, problem(lq=5, lk=4), params) == 1
    assert lib.call("irpe_bucket_ids_device", ctypes.byref(params), None, None) == 1


def test_launch_failure_is_reported(built):
    lib, _ = built
    if lib.device_count() > 0:
        pytest.skip("a CUDA device is present: tests/gpu runs the kernels instead")
    params = lib.make_params("product", 1.9, 2, 2, 1)
    status = lib.call("irpe_bucket_ids_device", ctypes.byref(params), DUMMY, None)
    assert status == 2
    message = lib.lib.irpe_last_error().decode()
    assert message.startswith("cuda") and len(message) > 10, message
    with pytest.raises(kernels_capi.KernelError, match="CUDA error: cuda"):
        lib._check(_gather(lib, problem()), "irpe_gather")
