"""The artifact contract: what a writer (train, export, triton-repo) puts in a file and every
reader (serve, validate, build-engine) reads back, defined once.

``trained`` (safetensors + ModelSpec metadata), ``contract`` (tensor names, ONNX metadata,
engine sidecars), ``exporters`` (the writer registry serve's demo uses), ``filecheck`` (cheap
checks before a runtime parses a file), ``triton_config`` (Triton's ModelConfig).
"""
