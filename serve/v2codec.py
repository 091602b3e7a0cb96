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

try:  # pysimdjson (the serve extra): JSON tensor data straight into numpy, no Python floats
    import simdjson
    FAST_JSON = True
except ImportError:  # pragma: no cover - the checked path below serves every request then
    FAST_JSON = False

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
    """Parse the JSON header and every input tensor (JSON data or binary part). A plain JSON
    body with float tensors takes the fast path (``fast_json``); anything it does not take
    (errors included) goes through the checked path, whose answers and messages it keeps."""
    if header_length is None and FAST_JSON:
        fast = fast_json(body)
        if fast is not None:
            return fast
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


def fast_json(body: bytes) -> Optional[Tuple[InferRequest, Dict[str, np.ndarray]]]:
    """A JSON infer body parsed by simdjson, float tensors read as one C buffer each (no Python
    object per element: the per-element work of the checked path was most of a JSON request's
    parse time); None for anything else (NaN tokens, ragged or odd nesting, strings, binary
    sizes, invalid JSON or header), which the checked path then answers as before."""
    try:
        doc: Any = simdjson.Parser().parse(body)
        if not isinstance(doc, simdjson.Object):
            return None
        given: Any = doc.get("inputs")
        if not isinstance(given, simdjson.Array):
            return None
        inputs: List[Any] = list(given)
        if not all(isinstance(obj, simdjson.Object) for obj in inputs):
            return None
        header = {k: _plain(doc[k]) for k in doc.keys() if k != "inputs"}
        header["inputs"] = [{k: _plain(obj[k]) for k in obj.keys() if k != "data"}
                            for obj in inputs]
        datas = [obj.get("data") for obj in inputs]
        request = InferRequest.model_validate(header)
        brackets, tensors = _brackets(header), {}
        for spec, data in zip(request.inputs, datas, strict=True):
            if spec.name in tensors or "binary_data_size" in spec.parameters:
                return None
            got = _fast_tensor(spec, data)
            if got is None:
                return None
            tensors[spec.name], arrays = got
            brackets += arrays
    except Exception:  # noqa: BLE001 (whatever the fast path cannot take, e.g. a KeyError
        return None     # of simdjson on a fuzzed key, the checked path answers as before)
    # every '[' of the body is one the request's header and regular tensor nesting account for
    opening = int(np.count_nonzero(np.frombuffer(body, np.uint8) == ord("[")))  # 4x bytes.count
    return (request, tensors) if opening == brackets else None


def _plain(value: Any) -> Any:
    """A simdjson value as plain Python (lists, dicts)."""
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    return value.as_list() if isinstance(value, simdjson.Array) else value


def _brackets(value: Any) -> int:
    """JSON arrays in a plain Python value."""
    if isinstance(value, list):
        return 1 + sum(_brackets(v) for v in value)
    return sum(_brackets(v) for v in value.values()) if isinstance(value, dict) else 0


def _fast_tensor(spec: TensorIn, data: Any) -> Optional[Tuple[np.ndarray, int]]:
    """(tensor, JSON arrays it spans) of a float tensor whose data nests its shape's leading
    dimensions row-major (flat included); other datatypes (small: detection sizes) through the
    checked path; None where the checked path should answer."""
    if not isinstance(data, simdjson.Array) or spec.datatype not in DATATYPES or not spec.shape:
        return None
    dtype = np.dtype(DATATYPES[spec.datatype])
    if dtype.kind != "f":
        values = data.as_list()
        return _json_tensor(spec.model_copy(update={"data": values}), dtype,
                            math.prod(spec.shape)), _brackets(values)
    if any(d < 0 for d in spec.shape) or \
            math.prod(max(d, 1) for d in spec.shape) * dtype.itemsize > _MAX_BYTES:
        return None
    arrays = _regular(data, spec.shape)
    if arrays is None:
        return None
    flat = np.frombuffer(data.as_buffer(of_type="d"), np.float64)  # TypeError: not numbers
    if flat.size != math.prod(spec.shape):
        return None
    return flat.astype(dtype).reshape(spec.shape), arrays


def _regular(data: Any, shape: List[int]) -> Optional[int]:
    """JSON arrays of ``data`` when it nests ``shape``'s leading dimensions exactly (each level
    the dimension's length, the innermost the rest of the shape flat); else None."""
    level, arrays = [data], 1
    for depth, dim in enumerate(shape):
        inner = [x for a in level for x in (a if len(a) and isinstance(a[0], simdjson.Array)
                                             else ())]
        if not inner:  # the innermost arrays: the rest of the shape, flat
            rest = math.prod(shape[depth:])
            return arrays if all(len(a) == rest for a in level) else None
        if any(len(a) != dim for a in level) or not all(isinstance(x, simdjson.Array)
                                                         for x in inner):
            return None
        level, arrays = inner, arrays + len(inner)
    return None


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
