"""Open Inference Protocol v2 tensors: JSON data, the binary-data extension and the
classification extension ("score:index:label" strings, as Triton formats them)."""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from .errors import ServeError, body_error

__all__ = ["InferRequest", "InferResponse", "OutTensor", "decode_request", "encode_response",
           "classification_strings", "DATATYPES", "datatype_of"]

DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
             "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
             "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
_MAX_BYTES = 1 << 48  # numpy cannot even describe much larger arrays, zero-sized or not
_KINDS = {"b": "b", "u": "biu", "i": "biu", "f": "biuf"}  # JSON element kinds each type accepts


class TensorIn(BaseModel):
    """An input tensor; ``data`` is flat or nested row-major, or absent with binary_data_size.
    The schema's enums and bounds are checked by the decoder (400 with the reason)."""

    name: str = Field(json_schema_extra={"enum": ["images", "sizes"]},
                      description="images (every model), sizes (detection)")
    shape: List[int] = Field(json_schema_extra={"items": {"type": "integer", "minimum": 0}},
                             description="dimensions, each >= 0")
    datatype: str = Field(json_schema_extra={"enum": list(DATATYPES)},
                          description="images: FP32; sizes: INT64 or INT32")
    parameters: Dict[str, Any] = Field(default_factory=dict)
    data: Optional[Any] = None


class TensorRequest(BaseModel):
    """A requested output; parameters: binary_data (bool), classification (int k)."""

    name: str
    parameters: Dict[str, Any] = Field(default_factory=dict)


class InferRequest(BaseModel):
    """Inference request header (JSON part of the body)."""

    id: Optional[str] = None
    parameters: Dict[str, Any] = Field(default_factory=dict)
    inputs: List[TensorIn] = Field(min_length=1)
    outputs: Optional[List[TensorRequest]] = None


class TensorOutDoc(BaseModel):
    """An output tensor (``data`` absent when sent as binary, see binary_data_size)."""

    name: str
    shape: List[int]
    datatype: str
    parameters: Optional[Dict[str, Any]] = None
    data: Optional[List[Any]] = None


class InferResponse(BaseModel):
    """Inference response header (for the OpenAPI document)."""

    model_name: str
    model_version: Optional[str] = None
    id: Optional[str] = None
    outputs: List[TensorOutDoc]


@dataclass
class OutTensor:
    """An output to send: array (BYTES arrays hold Python bytes) and its encoding."""

    name: str
    array: np.ndarray
    datatype: str
    binary: bool


def datatype_of(array: np.ndarray) -> str:
    """v2 datatype name of a numpy array."""
    for name, dtype in DATATYPES.items():
        if array.dtype == dtype:
            return name
    raise TypeError(f"no v2 datatype for {array.dtype}")


def decode_request(body: bytes, header_length: Optional[str]
                   ) -> Tuple[InferRequest, Dict[str, np.ndarray]]:
    """Parse the JSON header and every input tensor (JSON data or binary part)."""
    size = _header_size(header_length, len(body))
    try:
        request = InferRequest.model_validate_json(body[:size])
    except ValidationError as exc:
        raise body_error(exc) from None
    binary, offset, tensors = memoryview(body)[size:], 0, {}
    for spec in request.inputs:
        if spec.name in tensors:
            raise ServeError(400, f"input {spec.name} appears twice")
        tensors[spec.name], used = _tensor(spec, binary[offset:])
        offset += used
    if offset != len(binary):
        raise ServeError(400, f"{len(binary) - offset} bytes of binary data belong to no input")
    return request, tensors


def _header_size(header_length: Optional[str], total: int) -> int:
    if header_length is None:
        return total
    try:
        size = int(header_length)
    except ValueError:
        raise ServeError(400, f"Inference-Header-Content-Length is not an integer: "
                         f"{header_length!r}") from None
    if not 0 < size <= total:
        raise ServeError(400, f"Inference-Header-Content-Length {size} does not fit a body "
                         f"of {total} bytes")
    return size


def _tensor(spec: TensorIn, binary: memoryview) -> Tuple[np.ndarray, int]:
    if spec.datatype not in DATATYPES:
        raise ServeError(400, f"input {spec.name}: unsupported datatype {spec.datatype!r}")
    if any(d < 0 for d in spec.shape):
        raise ServeError(400, f"input {spec.name}: negative dimension in shape {spec.shape}")
    dtype, count = np.dtype(DATATYPES[spec.datatype]), math.prod(spec.shape)  # exact, no wrap
    if math.prod(max(d, 1) for d in spec.shape) * dtype.itemsize > _MAX_BYTES:
        raise ServeError(400, f"input {spec.name}: shape {spec.shape} is too large")
    nbytes = spec.parameters.get("binary_data_size")
    if nbytes is not None:
        if not isinstance(nbytes, int) or nbytes != count * dtype.itemsize or nbytes > len(binary):
            raise ServeError(400, f"input {spec.name}: binary_data_size {nbytes} does not match "
                             f"shape {spec.shape} {spec.datatype} or the body")
        return np.frombuffer(binary[:nbytes], dtype=dtype).reshape(spec.shape).copy(), nbytes
    return _json_tensor(spec, dtype, count), 0


def _json_tensor(spec: TensorIn, dtype: np.dtype, count: int) -> np.ndarray:
    if spec.data is None:
        raise ServeError(400, f"input {spec.name} has neither data nor binary_data_size")
    try:
        array = np.asarray(spec.data)
    except (ValueError, TypeError, OverflowError):
        raise ServeError(400, f"input {spec.name}: data is not a (nested) list of numbers") \
            from None
    if array.size and array.dtype.kind not in _KINDS[dtype.kind]:
        raise ServeError(400, f"input {spec.name}: data must hold {spec.datatype} numbers")
    if array.size != count:
        raise ServeError(400, f"input {spec.name}: {array.size} values for shape {spec.shape}")
    if not _fits(array, dtype):
        raise ServeError(400, f"input {spec.name}: value out of range for {spec.datatype}")
    return array.astype(dtype).reshape(spec.shape)


def _fits(array: np.ndarray, dtype: np.dtype) -> bool:
    """Whether integer ``array`` values fit ``dtype`` (numpy's astype would wrap them)."""
    if dtype.kind not in "iu" or not array.size:
        return True
    if array.dtype.kind == "O":  # Python ints beyond int64/uint64
        return False
    info = np.iinfo(dtype)
    return bool(array.min() >= info.min and array.max() <= info.max)


def classification_strings(values: np.ndarray, k: int, labels: List[str]) -> np.ndarray:
    """(B, C) scores -> (B, k) "score:index:label" bytes, best first (Triton's extension)."""
    k = min(k, values.shape[-1])
    order = np.argsort(-values, axis=-1, kind="stable")[:, :k]
    rows = [[f"{row[i]:f}:{i}:{labels[i]}".encode() for i in idx]
            for row, idx in zip(values, order, strict=True)]
    return np.array(rows, dtype=object).reshape(len(rows), k)


def encode_response(header: Dict[str, Any],
                    outputs: List[OutTensor]) -> Tuple[bytes, Optional[int]]:
    """Body of an infer response and the JSON header's length (None: no binary part)."""
    entries: List[Dict[str, Any]] = []
    blobs: List[bytes] = []
    for out in outputs:
        entry: Dict[str, Any] = {"name": out.name, "datatype": out.datatype,
                                 "shape": list(out.array.shape)}
        if out.binary:
            raw = _raw(out)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            flat = out.array.reshape(-1)
            entry["data"] = ([b.decode() for b in flat] if out.datatype == "BYTES"
                             else flat.tolist())
        entries.append(entry)
    head = json.dumps({**header, "outputs": entries}, separators=(",", ":")).encode()
    return (head + b"".join(blobs), len(head)) if blobs else (head, None)


def _raw(out: OutTensor) -> bytes:
    if out.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in out.array.reshape(-1))
    return np.ascontiguousarray(out.array).astype(out.array.dtype.newbyteorder("<")).tobytes()
