"""The runtimes exported files run on: ``onnxruntime`` (sessions and the load-time graph rewrites
for the custom-op library), ``tensorrt`` (engine build, isolated build, runner) and ``openvino``
(CPU plugin: options, reading an exported file or IR, compiling; the iRPE lowering).

export/ (validation, engine building) and serve/ (backends) both import these; neither imports
the other.
"""
