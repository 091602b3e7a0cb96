"""Where the checkout's build puts the native libraries (``make ort-ops``, ``make ov-ops``:
build/plugins/; sources: plugins/onnxruntime, plugins/openvino and their shared CPU kernels
plugins/cpu): the one place their loaders (irpe.runtime.onnxruntime.session,
irpe.runtime.openvino.library, irpe.fused.cpu_library) read it."""
from __future__ import annotations

from pathlib import Path

__all__ = ["BUILD_DIR"]

BUILD_DIR = Path(__file__).resolve().parents[1] / "build" / "plugins"
