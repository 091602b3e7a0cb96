"""The artifact contract: what export/ writes and serve/ reads, defined once.

Tensor names and dynamic axes per task, the ONNX opsets an export may have, the ``irpe.*``
metadata of ONNX files (written by ``irpe export``, read by serving, validation and engine
building), the JSON sidecar next to a TensorRT engine. onnx is imported inside the functions
that parse a file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from irpe.artifact.filecheck import check_file
from irpe.artifact.names import ENGINE_SUFFIXES, sidecar_path
from irpe.artifact.trained import ModelSpec, spec_from_metadata
from irpe.checkpoint import CheckpointError
from irpe.errors import InvalidInput, MissingFile
from irpe.rpe import RPEConfig

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["TASKS", "MIN_OPSET", "DEFAULT_OPSET", "MAX_OPSET", "input_names",
           "output_names", "dynamic_axes", "io_spec",
           "onnx_metadata", "read_onnx_props", "onnx_spec",
           "read_onnx_spec", "ENGINE_SUFFIXES", "sidecar_path", "write_sidecar", "read_sidecar",
           "engine_spec", "PRECISION_KEY", "QUANTIZATION_KEY", "quantization_metadata",
           "onnx_precision", "onnx_quantization"]

_INPUTS = {"classification": ("images",), "detection": ("images", "sizes")}
_OUTPUTS = {"classification": ("logits",), "detection": ("pred_logits", "pred_boxes")}
# every tensor's batch axis is dynamic; detection images also their height and width
_AXES = {"images": {0: "batch"}, "sizes": {0: "batch"}, "logits": {0: "batch"},
         "pred_logits": {0: "batch"}, "pred_boxes": {0: "batch"}}
TASKS = tuple(_INPUTS)

# ONNX opsets of an exported file: MIN_OPSET (the iRPE symbolics are registered from it) to
# MAX_OPSET (the highest of torch's TorchScript-based exporter); DEFAULT_OPSET unless asked
MIN_OPSET = 17
DEFAULT_OPSET = 18
MAX_OPSET = 20


def _task(task: str) -> str:
    if task not in _INPUTS:
        raise ValueError(f"unknown task {task!r}; expected one of {list(TASKS)}")
    return task


def input_names(task: str) -> Tuple[str, ...]:
    """Input tensors of a model of ``task``: ``images`` (+ ``sizes`` = valid (h, w), detection)."""
    return _INPUTS[_task(task)]


def output_names(task: str) -> Tuple[str, ...]:
    """Output tensors: ``logits``; detection ``pred_logits`` and ``pred_boxes`` (cx, cy, w, h)."""
    return _OUTPUTS[_task(task)]


def dynamic_axes(task: str) -> Dict[str, Dict[int, str]]:
    """Dynamic axes per tensor (torch.onnx.export form); detection images have dynamic H, W."""
    axes = {name: dict(_AXES[name]) for name in input_names(task) + output_names(task)}
    if task == "detection":
        axes["images"].update({2: "height", 3: "width"})
    return axes


def io_spec(task: str) -> Tuple[List[str], List[str], Dict[str, Dict[int, str]]]:
    """Input names, output names and dynamic axes of an exported model of ``task``."""
    return list(input_names(task)), list(output_names(task)), dynamic_axes(task)


def onnx_metadata(spec: "ModelSpec", rpe_config: Optional[RPEConfig], weights: str,
                  version: str) -> Dict[str, str]:
    """The contract's ``metadata_props`` of an exported file (the exporter adds its own keys)."""
    axes = json.dumps(dynamic_axes(spec.task))
    return {**spec.metadata(),
            "irpe.rpe_config": json.dumps(rpe_config.to_dict() if rpe_config else None),
            "irpe.weights": weights, "irpe.version": version, "irpe.dynamic_axes": axes}


PRECISION_KEY = "irpe.precision"  # "int8" in a quantised file; absent (fp32) in an export
QUANTIZATION_KEY = "irpe.quantization"  # JSON: how it was quantised (export/quantize.py)


def quantization_metadata(precision: str, record: Dict) -> Dict[str, str]:
    """The ``metadata_props`` a quantised file adds to its source's: precision and record."""
    return {PRECISION_KEY: precision, QUANTIZATION_KEY: json.dumps(record, sort_keys=True)}


def onnx_precision(props: Dict[str, str]) -> str:
    """The weights' precision an ONNX file's metadata states: ``fp32`` unless quantised."""
    return props.get(PRECISION_KEY, "fp32")


def onnx_quantization(props: Dict[str, str]) -> Optional[Dict]:
    """The quantisation record of a quantised file's metadata, or None."""
    text = props.get(QUANTIZATION_KEY)
    return json.loads(text) if text else None


def read_onnx_props(path: StrPath) -> Dict[str, str]:
    """All metadata_props of an ONNX file; a clear error for missing or corrupt files."""
    path = os.fspath(path)
    check_file(path, "onnx")  # missing (FileNotFoundError), empty, not a ModelProto
    import onnx
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise InvalidInput(f"{path} is not a readable ONNX file: {exc}") from None
    return {p.key: p.value for p in model.metadata_props}


def onnx_spec(props: Dict[str, str], path: StrPath) -> "ModelSpec":
    """The :class:`irpe.artifact.trained.ModelSpec` in an ONNX file's metadata_props (from
    :func:`read_onnx_props`; ``path`` names the file in the error)."""
    if not any(key.startswith("irpe.") for key in props):
        raise InvalidInput(f"{os.fspath(path)} is an ONNX file without irpe metadata (no irpe.* "
                           "keys): only files written by `irpe export` record the model, task "
                           "and preprocessing; export the model with `irpe export`")
    try:
        return spec_from_metadata(props)
    except CheckpointError as exc:
        raise InvalidInput(f"{os.fspath(path)}: {exc}") from None


def read_onnx_spec(path: StrPath) -> "ModelSpec":
    """The :class:`irpe.artifact.trained.ModelSpec` stored in an exported ONNX file."""
    return onnx_spec(read_onnx_props(path), path)


def write_sidecar(engine_path: StrPath, sidecar: Dict) -> Path:
    """Write an engine's sidecar (its ``onnx_metadata`` carries the source file's props),
    atomically (irpe.atomic)."""
    from irpe.atomic import write_text
    return write_text(sidecar_path(engine_path), json.dumps(sidecar, indent=2) + "\n")


def read_sidecar(engine_path: StrPath) -> Dict:
    """An engine's sidecar dict; MissingFile (a FileNotFoundError) naming the sidecar when it
    is absent."""
    path = sidecar_path(engine_path)
    if not path.is_file():
        raise MissingFile(f"{path} (the engine's sidecar) not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path} is not a JSON sidecar: {exc}") from None


def engine_spec(engine_path: StrPath) -> "ModelSpec":
    """The ModelSpec of an engine, from the ONNX metadata its sidecar recorded."""
    try:
        return spec_from_metadata(read_sidecar(engine_path).get("onnx_metadata", {}))
    except CheckpointError as exc:
        raise InvalidInput(f"{sidecar_path(engine_path)}: {exc}") from None
