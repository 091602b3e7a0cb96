"""Triton's model configuration (``ModelConfig``), written once for both of its readers.

``irpe triton-repo`` writes it as ``config.pbtxt`` (export/triton_repo.py) and ``irpe serve``
answers it as JSON on ``GET /v2/models/{name}/config`` (Triton's HTTP API, what ``tritonclient``'s
``get_model_config`` reads): both come from :func:`model_config`, so they cannot drift apart.
The dict uses the proto's field names, as Triton's JSON does (int64 values as numbers).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from irpe.errors import InvalidInput

if TYPE_CHECKING:  # onnx is imported where a file is read (the export extra)
    import onnx
    from _typeshed import StrPath

__all__ = ["TensorInfo", "onnx_io", "model_config", "pbtxt", "V2_TYPES"]

# onnx.TensorProto element types -> Triton model-config data types
_ONNX_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
               6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL",
               10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32", 13: "TYPE_UINT64",
               16: "TYPE_BF16"}
# Open Inference Protocol datatypes -> Triton model-config data types
V2_TYPES = {"BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16",
            "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8",
            "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
            "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BF16": "TYPE_BF16",
            "BYTES": "TYPE_STRING"}
_ENUMS = ("data_type", "kind")  # written bare in protobuf text format


@dataclass
class TensorInfo:
    """One graph input or output: name, Triton data type, full dims (-1 = dynamic)."""

    name: str
    data_type: str
    dims: List[int]
    batch_dynamic: bool


def onnx_io(path: StrPath) -> Tuple[List[TensorInfo], List[TensorInfo]]:
    """Inputs (initializers excluded) and outputs of an ONNX file, with Triton dtypes."""
    import onnx
    model = onnx.load(os.fspath(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    ins = [_onnx_tensor(v) for v in model.graph.input if v.name not in inits]
    return ins, [_onnx_tensor(v) for v in model.graph.output]


def _onnx_tensor(value: onnx.ValueInfoProto) -> TensorInfo:
    ttype = value.type.tensor_type
    if ttype.elem_type not in _ONNX_TYPES:
        raise InvalidInput(f"tensor {value.name!r} has ONNX element type {ttype.elem_type}, "
                           "which Triton cannot serve")
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
    first = ttype.shape.dim[0] if dims else None
    dynamic = first is not None and not first.HasField("dim_value")
    return TensorInfo(value.name, _ONNX_TYPES[ttype.elem_type], dims, dynamic)


def model_config(name: str, platform: str, inputs: Sequence[TensorInfo],
                 outputs: Sequence[TensorInfo], max_batch_size: int, max_queue_delay_us: int,
                 instances: int, kind: str, label_file: Optional[str] = None,
                 op_libraries: Sequence[str] = ()) -> Dict[str, Any]:
    """Triton ModelConfig of one model; dims without the batch axis when it batches
    (max_batch_size > 0); ``label_file`` on the first output (classification extension)."""
    strip = 1 if max_batch_size > 0 else 0
    cfg: Dict[str, Any] = {"name": name, "platform": platform, "max_batch_size": max_batch_size,
                           "input": [_tensor(t, strip) for t in inputs],
                           "output": [_tensor(t, strip) for t in outputs]}
    if label_file and cfg["output"]:
        cfg["output"][0]["label_filename"] = label_file
    if max_batch_size > 0:
        cfg["dynamic_batching"] = {"max_queue_delay_microseconds": max_queue_delay_us}
    cfg["instance_group"] = [{"count": instances, "kind": f"KIND_{kind.upper()}"}]
    if op_libraries:
        cfg["model_operations"] = {"op_library_filename": list(op_libraries)}
    return cfg


def _tensor(t: TensorInfo, strip: int) -> Dict[str, Any]:
    return {"name": t.name, "data_type": t.data_type, "dims": list(t.dims[strip:]) or [1]}


def pbtxt(cfg: Dict[str, Any], indent: str = "") -> List[str]:
    """Protobuf text format lines of a :func:`model_config` dict (config.pbtxt)."""
    lines: List[str] = []
    for key, value in cfg.items():
        if isinstance(value, dict):
            lines += [f"{indent}{key} {{", *pbtxt(value, indent + "  "), f"{indent}}}"]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{indent}{key} [")
            for i, item in enumerate(value):
                lines += [f"{indent}  {{", *pbtxt(item, indent + "    "),
                          f"{indent}  }}" + ("," if i < len(value) - 1 else "")]
            lines.append(f"{indent}]")
        elif isinstance(value, list):
            lines.append(f"{indent}{key}: [ {', '.join(_scalar(key, v) for v in value)} ]")
        else:
            lines.append(f"{indent}{key}: {_scalar(key, value)}")
    return lines


def _scalar(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value if key in _ENUMS else '"' + value.replace("\\", "\\\\").replace('"', '\\"') \
            + '"'
    return str(value)
