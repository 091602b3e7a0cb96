"""Cheap structural checks of model artifacts before a runtime parses them.

Size and magic / header of safetensors weights, ONNX models and serialized TensorRT engines, so
a missing, empty, truncated or wrong-kind file is one clear error instead of a parser crash deep
in onnx, ONNX Runtime or TensorRT. Full validation stays with the parsers.
"""
from __future__ import annotations

import os
import re
import struct
from typing import TYPE_CHECKING, Callable, Dict, Optional

from irpe.checkpoint import CheckpointError

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["ArtifactError", "ArtifactMissing", "check_file", "KINDS"]


class ArtifactError(CheckpointError, ValueError):
    """An artifact file that is not of its declared kind (size, magic, header)."""


class ArtifactMissing(ArtifactError, FileNotFoundError):
    """An artifact path that is not a file."""


def _safetensors(head: bytes, size: int) -> Optional[str]:
    if size < 10:
        return f"{size} bytes, shorter than a safetensors header"
    length = struct.unpack("<Q", head[:8])[0]
    if length < 2 or 8 + length > size:
        return f"header length {length} does not fit the {size}-byte file{_looks_like(head)}"
    if head[8:9] != b"{":
        return "its header is not JSON"
    return None


def _onnx(head: bytes, size: int) -> Optional[str]:
    if size < 4 or head[0] != 0x08:  # a ModelProto starts with field 1 (ir_version), a varint
        return f"no ModelProto (it must start with ir_version){_looks_like(head)}"
    version = _varint(head[1:11])
    if not 1 <= version <= 64:
        return f"implausible ir_version {version}"
    return None


_ENGINE_TAG = re.compile(rb"^[a-z]trt")  # TensorRT-RTX 1.7 writes b"vtrt"


def _engine(head: bytes, size: int) -> Optional[str]:
    if size < 32 or not _ENGINE_TAG.match(head):
        return f"no engine magic tag at the start{_looks_like(head)}"
    if head[:4] == b"vtrt":  # TensorRT-RTX: u64 total size at offset 16
        declared = struct.unpack("<Q", head[16:24])[0]
        if declared != size:
            return f"truncated: its header says {declared} bytes, the file has {size}"
    return None


def _ir(head: bytes, size: int) -> Optional[str]:
    text = head.lstrip()
    if not (text.startswith(b"<?xml") or text.startswith(b"<net")):
        return f"no XML at the start{_looks_like(head)}"
    return None


_CHECKS: Dict[str, Callable[[bytes, int], Optional[str]]] = {
    "safetensors": _safetensors, "onnx": _onnx, "engine": _engine, "ir": _ir}
_LABELS = {"safetensors": "safetensors file", "onnx": "ONNX file", "engine": "TensorRT engine",
           "ir": "OpenVINO IR file"}
KINDS = tuple(_CHECKS)


def check_file(path: StrPath, kind: str) -> None:
    """Raise :class:`ArtifactError` unless ``path`` exists (else :class:`ArtifactMissing`) and
    looks like a ``kind`` file (``safetensors``, ``onnx``, ``engine``, ``ir``): size, magic,
    header."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        label = "model file" if kind == "safetensors" else _LABELS[kind]
        if os.path.isdir(path):
            article = "an" if label[0] in "AEIOU" else "a"
            raise ArtifactMissing(f"{path} is a folder, not {article} {label}")
        raise ArtifactMissing(f"{label} not found: {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(64)
    problem = "empty file" if size == 0 else _CHECKS[kind](head, size)
    if problem:
        raise ArtifactError(f"{path} is not a readable {_LABELS[kind]}: {problem}")


def _varint(data: bytes) -> int:
    value = 0
    for shift, byte in enumerate(data):
        value |= (byte & 0x7F) << (7 * shift)
        if byte < 0x80:
            return value
    return -1


def _looks_like(head: bytes) -> str:
    """A hint when the bytes are another artifact kind (a swapped path)."""
    if _ENGINE_TAG.match(head):
        return "; it looks like a TensorRT engine"
    if head[:1] == b"\x08":
        return "; it looks like an ONNX file"
    if len(head) > 9 and head[8:9] == b"{" and head[9:10] == b'"':
        return "; it looks like a safetensors file"
    return ""
