"""iRPE CUDA kernels (kernels/), TensorRT plugins (tensorrt/), PyTorch CUDA ops (pytorch/).

Python: :mod:`plugins.kernel_sources` (kernel source list, method ids, nvcc lookup) and
:mod:`plugins.pytorch` (JIT-built torch extension that backs irpe::rpe_gather/rpe_scatter on
CUDA). Importable from the repository root. Build and inspection aids for tests (ctypes view of
the C ABI, the TensorRT plugin build) are in tools/.
"""
