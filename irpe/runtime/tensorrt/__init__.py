"""TensorRT (or TensorRT-RTX): ``build`` (ONNX -> engine + sidecar), ``isolate`` (a build in a
child process, for plugin libraries), ``runner`` (an engine on torch CUDA tensors), ``common``
(module import, logger, plugin libraries)."""
