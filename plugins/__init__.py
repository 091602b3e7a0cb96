"""Native code of the iRPE ops: CUDA kernels (kernels/), TensorRT plugins (tensorrt/), the shared
CPU kernels and libirpe_cpu_attention (cpu/), the ONNX Runtime custom-op library (onnxruntime/)
and the OpenVINO library (openvino/), both on cpu/'s kernels, and the PyTorch CUDA ops
(pytorch/); map in plugins/README.md.

Python: :mod:`plugins.kernel_sources` (kernel source list, method ids, nvcc lookup) and
:mod:`plugins.pytorch` (JIT-built torch extension that backs irpe::rpe_gather/rpe_scatter on
CUDA). Importable from the repository root. Build and inspection aids for tests (ctypes view of
the C ABI, the TensorRT plugin build) are in tools/.
"""
