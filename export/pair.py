"""Is a ``--source`` model comparable with an exported file? Checked before anything runs.

A classifier file validated against a detector, or a file exported at another input size, used
to end in an ONNX Runtime traceback (or a bare KeyError) with the exit status of a numeric
FAIL. This check names what differs, as a usage error (``irpe validate`` exits 2).
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional

from irpe.artifact.contract import ENGINE_SUFFIXES
from irpe.errors import InvalidInput

from .source import Source

__all__ = ["check_pair", "file_dims"]


def file_dims(path: str) -> Dict[str, List[Optional[int]]]:
    """Input/output dims of an ONNX file (int when static, else None); {} for engines."""
    if path.endswith(ENGINE_SUFFIXES):
        return {}
    import onnx
    graph = onnx.load(path, load_external_data=False).graph
    return {v.name: [d.dim_value if d.HasField("dim_value") else None
                     for d in v.type.tensor_type.shape.dim]
            for v in list(graph.input) + list(graph.output)}


def _source_side(src: Source) -> Optional[int]:
    """Square input side a classification source takes (the side validate feeds it)."""
    if src.spec.task != "classification":
        return None
    img = getattr(getattr(src.model, "patch_embed", None), "img_size", None)
    img = img[0] if isinstance(img, (tuple, list)) else img
    return int(img or src.spec.preprocess.get("size", 224))


def _differences(path: str, props: Dict[str, str], src: Source) -> List[str]:
    task = props.get("irpe.task")
    if task is not None and task != src.spec.task:
        return [f"task: file {task}, source {src.spec.task}"]
    out = []
    classes = len(json.loads(props.get("irpe.class_names", "[]")))
    source_classes = getattr(src.model, "num_classes", len(src.spec.class_names))
    if classes and classes != source_classes:
        out.append(f"classes: file {classes}, source {source_classes}")
    dims = file_dims(path)
    images, side = dims.get("images", []), _source_side(src)
    if side is not None and len(images) == 4 and None not in images[2:] \
            and tuple(images[2:]) != (side, side):
        out.append(f"input size: file {images[2]}x{images[3]}, source {side}x{side}")
    queries = (dims.get("pred_logits") or [None, None])[1]
    source_queries = getattr(src.model, "num_queries", None)
    if None not in (queries, source_queries) and queries != source_queries:
        out.append(f"queries: file {queries}, source {source_queries}")
    return out


def check_pair(path: str, props: Dict[str, str], src: Source, name: str) -> None:
    """InvalidInput (a ValueError) naming every difference (task, class count, input size,
    DETR queries) between the file (its irpe metadata and ONNX tensor dims) and the source
    model."""
    differ = _differences(path, props, src)
    if differ:
        raise InvalidInput(f"{path} and source {name} do not match ({'; '.join(differ)}); "
                           "pass the model the file was exported from")
