"""The demo repository: the bundled shapes classifier and detector, served offline.

For the onnxruntime backend the bundled trained-model files are exported once to ONNX in the
cache (``$IRPE_CACHE/onnx``, named by a digest of the weights and the exporter), so later starts
reuse them.
"""
from __future__ import annotations

import hashlib
import inspect
import logging
import os
from pathlib import Path
from typing import List, Optional

import irpe
from irpe.models.registry import bundled_weights, model_info

from .config import ModelConfig

__all__ = ["DEMO_MODELS", "demo_models", "onnx_cache_path"]

DEMO_MODELS = ("deit_shapes_irpe", "detr_shapes_irpe")
log = logging.getLogger("irpe.serve")


def demo_models(backend: str = "onnxruntime", cache_dir: Optional[Path] = None,
                device: str = "cpu") -> List[ModelConfig]:
    """Configs of the demo models; exports ONNX files first when missing (onnxruntime)."""
    configs = []
    for name in DEMO_MODELS:
        weights = Path(bundled_weights(model_info(name)))  # clear FileNotFoundError if absent
        path = weights if backend == "torch" else _exported(weights, cache_dir)
        configs.append(ModelConfig(name=name, path=path, backend=backend, device=device))
    return configs


def onnx_cache_path(weights: Path, cache_dir: Optional[Path] = None) -> Path:
    """Where the ONNX export of ``weights`` lives (digest of the weights and of every source
    file of irpe/ and export/, so any change to the models or the exporter re-exports)."""
    import export
    digest = hashlib.sha256(weights.read_bytes())
    digest.update(irpe.__version__.encode())
    for package in (irpe, export):
        root = Path(inspect.getsourcefile(package)).parent
        for source in sorted(root.rglob("*.py")):
            digest.update(str(source.relative_to(root)).encode() + source.read_bytes())
    if cache_dir is None:
        from irpe.weights import cache_dir as default_cache
        cache_dir = default_cache()
    return Path(cache_dir) / "onnx" / f"{weights.stem}-{digest.hexdigest()[:12]}.onnx"


def _exported(weights: Path, cache_dir: Optional[Path]) -> Path:
    try:
        from export.onnx import export_onnx
    except ImportError as exc:
        raise RuntimeError(f"the onnxruntime backend needs the ONNX exporter (export/onnx.py): "
                           f"{exc}; serve the demo with --backend torch") from None
    out = onnx_cache_path(weights, cache_dir)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.onnx")
    log.info("exporting demo model to ONNX (first start)", extra={"weights": str(weights),
                                                                   "onnx": str(out)})
    try:
        export_onnx(str(weights), str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
