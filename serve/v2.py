"""Open Inference Protocol v2 routes (KServe / Triton HTTP): health, metadata, infer."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

import irpe

from .errors import ServeError, error_responses, unavailable
from .inputs import media_type, read_body
from .state import app_state, get_model, require_token
from .tracing import span
from .v2codec import InferResponse, decode_request, encode_response
from .v2infer import model_metadata, run_infer, triton_config

__all__ = ["router", "infer_request_body"]

router = APIRouter(prefix="/v2", tags=["Open Inference Protocol v2"])
EXTENSIONS = ["binary_tensor_data", "classification"]
_V2_TYPES = ("", "application/json", "application/octet-stream")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: List[str]


class TensorMeta(BaseModel):
    name: str
    datatype: str
    shape: List[int]


class ModelMetadata(BaseModel):
    name: str
    versions: List[str]
    platform: str
    inputs: List[TensorMeta]
    outputs: List[TensorMeta]
    parameters: Dict[str, Any]


@router.get("", response_model=ServerMetadata)
async def server_metadata() -> Dict:
    """Server name, version and supported protocol extensions."""
    return {"name": "irpe-serve", "version": irpe.__version__, "extensions": EXTENSIONS}


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool


@router.get("/health/live", response_model=Live)
async def live() -> Dict:
    """200 while the process serves HTTP."""
    return {"live": True}


@router.get("/health/ready", response_model=Ready, responses=error_responses(503))
async def ready(request: Request) -> Dict:
    """200 once every model is loaded and warmed up; 503 before, and while shutting down."""
    reason = app_state(request).not_ready()
    if reason:
        raise unavailable(reason, 5)
    return {"ready": True}


@router.get("/models/{name}", response_model=ModelMetadata, responses=error_responses(404))
@router.get("/models/{name}/versions/{version}", response_model=ModelMetadata,
            responses=error_responses(404), include_in_schema=False)
async def metadata(request: Request, name: str, version: Optional[str] = None) -> Dict:
    """Inputs, outputs (v2 datatypes and shapes, -1 = any) and the model's labels/preprocess."""
    model = app_state(request).model(name, version)
    return model_metadata(model)


@router.get("/models/{name}/config", responses=error_responses(404))
@router.get("/models/{name}/versions/{version}/config", responses=error_responses(404),
            include_in_schema=False)
async def config(request: Request, name: str, version: Optional[str] = None) -> Dict:
    """Triton's model configuration (config.pbtxt as JSON, what tritonclient's get_model_config
    reads): the same config `irpe triton-repo` writes, with this server's batching."""
    model = app_state(request).model(name, version)
    return triton_config(model)


@router.get("/models/{name}/ready", response_model=ModelReady,
            responses=error_responses(404, 503))
@router.get("/models/{name}/versions/{version}/ready", response_model=ModelReady,
            include_in_schema=False)
async def model_ready(request: Request, name: str, version: Optional[str] = None) -> Dict:
    """200 when the model can infer, 503 (with the reason) otherwise."""
    model = app_state(request).model(name, version)
    model.check_ready()
    return {"name": name, "ready": True}


def infer_request_body() -> Dict:
    """OpenAPI requestBody: JSON, or JSON header + binary tensors (binary-data extension)."""
    ref = {"$ref": "#/components/schemas/InferRequest"}
    return {"required": True, "content": {
        "application/json": {"schema": ref},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                     "description": "JSON header of Inference-Header-Content-"
                                     "Length bytes, then the binary_data_size tensors"}}}


_BINARY_RESPONSE: Dict[Union[int, str], Dict[str, Any]] = {
    200: {"description": "JSON, or with binary outputs: the JSON header "
          "(Inference-Header-Content-Length bytes) then the tensors",
          "content": {"application/octet-stream": {}}}}
_INFER: Dict[str, Any] = dict(
    response_model=InferResponse, dependencies=[Depends(require_token)],
    responses={**_BINARY_RESPONSE, **error_responses(400, 401, 404, 413, 415, 422, 500, 503,
                                                     504)},
    openapi_extra={"requestBody": infer_request_body()})


@router.post("/models/{name}/infer", **_INFER)
@router.post("/models/{name}/versions/{version}/infer", include_in_schema=False, **_INFER)
async def infer(request: Request, name: str, version: Optional[str] = None) -> Response:
    """Run the model on tensors: ``images`` FP32 [B,3,H,W] (+ ``sizes`` INT64 [B,2] for
    detection); outputs ``logits`` or ``pred_logits``/``pred_boxes``."""
    model = get_model(request, name, version)
    if media_type(request) not in _V2_TYPES:
        raise ServeError(415, f"unsupported media type {media_type(request)}: send "
                         "application/json or application/octet-stream")
    with span("read_body"):  # 415 first
        body = await read_body(request, app_state(request).settings.max_body_bytes)
    model.shed()  # a full queue answers 503 before any tensor is parsed
    with span("decode"):
        req, tensors = decode_request(body, request.headers.get("inference-header-content-length"))
    outputs = await run_infer(model, req, tensors, app_state(request).settings.v2_nonfinite)
    header = {"model_name": model.name, "model_version": "1"}
    if req.id is not None:
        header["id"] = req.id
    payload, json_size = encode_response(header, outputs)
    headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
    kind = "application/json" if json_size is None else "application/octet-stream"
    return Response(payload, media_type=kind, headers=headers)
