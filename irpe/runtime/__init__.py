"""The runtimes exported files run on: ``onnxruntime`` (sessions and the load-time graph rewrites
for the custom-op library) and ``tensorrt`` (engine build, isolated build, runner).

export/ (validation, engine building) and serve/ (backends) both import these; neither imports
the other.
"""
