"""ONNX Runtime: ``session`` (sessions with the custom-op library when present) and the graph
rewrites applied at load (``rewrites``, with the ``rewrite_attention`` and ``rewrite_qlayout``
stages)."""
