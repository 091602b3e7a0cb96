"""torch -> ONNX export of iRPE models (RPE nodes + local functions), validation, TensorRT.

Submodules: ``onnx`` (export_onnx, read_metadata), ``validate``, ``tensorrt`` (build_engine;
the runner is irpe.deploy.trt_runtime.TRTRunner), ``cli``. Import them directly; this package
imports nothing heavy.
"""
