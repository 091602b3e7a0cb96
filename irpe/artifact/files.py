"""What a model file is, read cheaply (no weights loaded): its kind, metadata, spec and precision.

The one place that tells an exported ``.onnx``, an OpenVINO IR (``.xml`` + ``.bin``), a TensorRT
engine (with its JSON sidecar) and a trained model's ``.safetensors`` apart, and reads each
one's ``irpe.*`` metadata. The runtime layer (:mod:`irpe.runtime.pick`), serve's backends,
``irpe validate`` and ``irpe eval`` all read files through it, so one file reads the same
everywhere.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Tuple

from irpe.errors import InvalidInput

from .contract import ENGINE_SUFFIXES, onnx_precision, onnx_spec, read_onnx_props, read_sidecar
from .openvino_ir import is_ir, read_ir_props

if TYPE_CHECKING:
    from .trained import ModelSpec

__all__ = ["KINDS", "FileInfo", "file_kind", "read_props", "read_file_info", "check_classes"]

# file kind -> what it is (for messages)
KINDS: Dict[str, str] = {"onnx": "an exported ONNX file", "ir": "an OpenVINO IR",
                         "engine": "a TensorRT engine", "trained": "a trained model"}


def file_kind(path: "os.PathLike[str] | str") -> str:
    """``onnx`` | ``ir`` | ``engine`` | ``trained`` (a ``.safetensors`` or a model name), by
    the file's name."""
    name = os.fspath(path).lower()
    if name.endswith(".onnx"):
        return "onnx"
    if is_ir(name):
        return "ir"
    if name.endswith(ENGINE_SUFFIXES):
        return "engine"
    return "trained"


@dataclass(frozen=True)
class FileInfo:
    """A file's metadata as its writer recorded it: ``props`` (the ``irpe.*`` keys), the
    :class:`ModelSpec` they describe and ``precision``, the weights' precision the file fixes
    (``int8`` for a quantised file, else ``fp32``: a runtime may still compile it in bf16)."""

    path: str
    kind: str
    props: Mapping[str, str]
    spec: "ModelSpec"
    precision: str


def read_props(path: "os.PathLike[str] | str") -> Dict[str, str]:
    """The metadata of an exported ``.onnx``, an IR or an engine (its sidecar's record of the
    ONNX file's); one line for a missing or foreign file (MissingFile / InvalidInput)."""
    path = os.fspath(path)
    kind = file_kind(path)
    if kind == "trained":
        raise InvalidInput(f"{path} is not an exported file (.onnx, OpenVINO .xml or a TensorRT "
                           "engine)")
    if kind == "engine":
        return dict(read_sidecar(path).get("onnx_metadata", {}))
    return read_ir_props(path) if kind == "ir" else read_onnx_props(path)


def read_file_info(path: "os.PathLike[str] | str", spec: Optional["ModelSpec"] = None
                   ) -> FileInfo:
    """The :class:`FileInfo` of an exported ``.onnx``, an IR or an engine; ``spec``: the
    model the caller knows the file holds (else the file's metadata must say)."""
    from .trained import spec_from_metadata
    path = os.fspath(path)
    kind = file_kind(path)
    props = read_props(path)
    if spec is None:
        spec = spec_from_metadata(props) if kind == "engine" else onnx_spec(props, path)
    return FileInfo(path, kind, props, spec, onnx_precision(props))


def check_classes(path: str, spec: "ModelSpec", outputs: Mapping[str, Tuple[Optional[int], ...]]
                  ) -> None:
    """Refuse a file whose class list does not match its outputs (``outputs``: each output's
    shape, None for a dynamic axis): classification ``logits`` end in one score a class,
    detection ``pred_logits`` in one a class plus "no object". InvalidInput of one line,
    before a request would fail on it."""
    names = spec.class_names
    if not names:
        return
    key, extra = ("logits", 0) if spec.task == "classification" else ("pred_logits", 1)
    shape = outputs.get(key)
    width = shape[-1] if shape else None
    if width is not None and width != len(names) + extra:
        raise InvalidInput(f"{path}: its metadata names {len(names)} classes but its {key} "
                           f"have {width} scores ({len(names) + extra} expected): the class "
                           "list does not belong to this model")
