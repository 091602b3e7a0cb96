"""iRPE CUDA kernels (kernels/), TensorRT plugins (tensorrt/), PyTorch CUDA ops (pytorch/).

Python helpers: :mod:`plugins.capi` (ctypes view of the kernels' C ABI, build helpers) and
:mod:`plugins.pytorch` (JIT-built torch extension that backs irpe::rpe_gather/rpe_scatter on
CUDA). Importable from the repository root.
"""
