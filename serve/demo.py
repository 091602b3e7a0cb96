"""The demo repository: the bundled shapes classifier and detector, served offline.

For the onnxruntime and openvino backends the bundled trained-model files are exported once to
ONNX in the cache (``$IRPE_CACHE/onnx``, named by a digest of the weights and the exporter), so
later starts reuse them. The exporter is the one registered with ``irpe.artifact.exporters``
(kind ``onnx``): serve never imports export/.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import List, Optional

from irpe.artifact.exporters import Exporter, get_exporter
from irpe.atomic import atomic_path
from irpe.models.registry import bundled_weights, model_info
from irpe.runtime.pick import onnx_runtime

from .config import ModelConfig
from .registry import AUTO

__all__ = ["DEMO_MODELS", "demo_models", "onnx_cache_path"]

DEMO_MODELS = ("deit_shapes_irpe", "detr_shapes_irpe")
log = logging.getLogger("irpe.serve")


def demo_models(backend: str = AUTO, cache_dir: Optional[Path] = None,
                device: str = "cpu") -> List[ModelConfig]:
    """Configs of the demo models; exports ONNX files first when missing (every backend but
    torch reads the ONNX file: onnxruntime, openvino). ``auto``: the ONNX files on the
    runtime irpe.runtime.pick.onnx_runtime picks (OpenVINO on the CPU where installed)."""
    if backend == AUTO:
        backend = onnx_runtime(device)
    configs = []
    for name in DEMO_MODELS:
        weights = Path(bundled_weights(model_info(name)))  # clear FileNotFoundError if absent
        path = weights if backend == "torch" else _exported(weights, cache_dir, backend)
        configs.append(ModelConfig(name=name, path=path, backend=backend, device=device))
    return configs


def onnx_cache_path(weights: Path, cache_dir: Optional[Path] = None,
                    exporter: Optional[Exporter] = None) -> Path:
    """Where the ONNX export of ``weights`` lives (digest of the weights and of every source
    file of irpe/ and the exporter, so any change to the models or the exporter re-exports)."""
    digest = hashlib.sha256(weights.read_bytes())
    digest.update((exporter or _onnx_exporter()).fingerprint().encode())
    if cache_dir is None:
        from irpe.weights import cache_dir as default_cache
        cache_dir = default_cache()
    return Path(cache_dir) / "onnx" / f"{weights.stem}-{digest.hexdigest()[:12]}.onnx"


def _onnx_exporter(backend: str = "onnxruntime") -> Exporter:
    try:
        return get_exporter("onnx")
    except RuntimeError as exc:
        raise RuntimeError(f"the {backend} backend needs the ONNX exporter: {exc}; serve the "
                           "demo with --backend torch") from None


def _exported(weights: Path, cache_dir: Optional[Path], backend: str = "onnxruntime") -> Path:
    exporter = _onnx_exporter(backend)
    out = onnx_cache_path(weights, cache_dir, exporter)
    if out.is_file():
        return out
    log.info("exporting demo model to ONNX (first start)", extra={"weights": str(weights),
                                                                   "onnx": str(out)})
    try:
        with atomic_path(out) as tmp:  # complete or absent, also for a concurrent start
            exporter.write(str(weights), tmp)
    except ImportError as exc:  # the exporter's own dependencies (onnx, onnxscript)
        raise RuntimeError(f"the {backend} backend needs the ONNX exporter: {exc}; serve the "
                           "demo with --backend torch") from None
    return out
