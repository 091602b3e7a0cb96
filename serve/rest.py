"""REST routes: /v1/models, classify and detect (images in, labels / boxes out)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Literal, Optional, Tuple, cast

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from irpe.data.transforms import ImageError

from .errors import ServeError, error_responses
from .inputs import image_request_body, read_images
from .model import Input, ServedModel
from .results import classification_results, detection_results
from .state import app_state, default_model, get_model, require_token
from .tracing import span

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["REST"])
_FILE_OBJECT = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>")
_INFER_ERRORS = error_responses(400, 401, 404, 413, 415, 422, 500, 503, 504)


class Classification(BaseModel):
    """Top-k classes of one image, best first; scores are softmax probabilities."""

    labels: List[str]
    indices: List[int]
    scores: List[float]


class ClassifyResponse(BaseModel):
    model: str
    results: List[Classification] = Field(description="one entry per image, in request order")


class Detection(BaseModel):
    label: str
    index: int = Field(description="class index")
    score: float
    box: List[float] = Field(description="pixels of the original image: x0, y0, x1, y1 "
                             "(box_format=xyxy) or x, y, width, height (box_format=coco)")


class ImageDetections(BaseModel):
    height: int = Field(description="original image height in pixels")
    width: int
    detections: List[Detection] = Field(description="score >= threshold, best first")


class DetectResponse(BaseModel):
    model: str
    results: List[ImageDetections] = Field(description="one entry per image, in request order")


class ModelMemory(BaseModel):
    host_bytes: Optional[int] = Field(description="resident memory its load and warm-up added "
                                      "(all instances); null: loading, or not measured alone")
    device_bytes: Optional[int] = Field(description="CUDA memory they added; null on the CPU")


class ModelSummary(BaseModel):
    name: str
    task: str
    backend: str
    platform: str
    model: str = Field(description="registry name of the architecture")
    state: str = Field(description="loading, ready, failed or stopping")
    num_classes: int
    max_batch_size: int
    precision: str = Field(description="fp32, fp16, bf16, or int8 for a quantised ONNX file "
                                       "(its metadata)")
    memory: ModelMemory = Field(description="what the model holds once loaded and warmed up "
                                "(docs/observability.md)")


class ModelDetail(ModelSummary):
    labels: List[str]
    preprocess: Dict[str, Any] = Field(description="the eval transform applied to each image")


TopK = Query(5, ge=1, le=1000, description="classes per image (at most the model's classes)")
Threshold = Query(0.5, ge=0.0, le=1.0, description="minimum score of a detection")
MaxDetections = Query(100, ge=1, le=10_000, description="detections per image, best first")
BoxFormat = Query("xyxy", description="xyxy: corners; coco: x, y, width, height")


@router.get("/models", response_model=List[ModelSummary])
async def list_models(request: Request) -> List[Dict]:
    """Every configured model with its task, backend and state."""
    return [m.describe() for m in app_state(request).models.values()]


@router.get("/models/{name}", response_model=ModelDetail, responses=error_responses(404))
async def model_detail(request: Request, name: str) -> Dict:
    """One model: labels and preprocessing besides the summary."""
    model = app_state(request).model(name)
    return {**model.describe(), "labels": model.labels, "preprocess": model.preprocess.to_dict()}


def _image_route(path: str, summary: str, response_model: type):
    return router.post(path, summary=summary, response_model=response_model,
                       dependencies=[Depends(require_token)], responses=_INFER_ERRORS,
                       openapi_extra={"requestBody": image_request_body()})


@_image_route("/models/{name}/classify", "Classify images", ClassifyResponse)
async def classify(request: Request, name: str, top_k: int = TopK) -> Dict:
    """Top-k classes of each image (multipart files, raw image body or JSON base64)."""
    return await _classify(request, get_model(request, name), top_k)


@_image_route("/classify", "Classify images with the default classifier", ClassifyResponse)
async def classify_default(request: Request, top_k: int = TopK) -> Dict:
    """/v1/models/{name}/classify for the default (or first) classification model."""
    return await _classify(request, default_model(request, "classification"), top_k)


@_image_route("/models/{name}/detect", "Detect objects", DetectResponse)
async def detect(request: Request, name: str, threshold: float = Threshold,
                 max_detections: int = MaxDetections,
                 box_format: Literal["xyxy", "coco"] = BoxFormat) -> Dict:
    """Boxes, labels and scores of each image, in the original image's pixels."""
    return await _detect(request, get_model(request, name), threshold, max_detections,
                         box_format)


@_image_route("/detect", "Detect objects with the default detector", DetectResponse)
async def detect_default(request: Request, threshold: float = Threshold,
                         max_detections: int = MaxDetections,
                         box_format: Literal["xyxy", "coco"] = BoxFormat) -> Dict:
    """/v1/models/{name}/detect for the default (or first) detection model."""
    return await _detect(request, default_model(request, "detection"), threshold,
                         max_detections, box_format)


async def _classify(request: Request, model: ServedModel, top_k: int) -> Dict:
    _check_task(model, "classification", "detect")
    _, rows = await _infer(request, model)
    return {"model": model.name, "results": classification_results(rows, model.labels, top_k)}


async def _detect(request: Request, model: ServedModel, threshold: float, max_detections: int,
                  box_format: str) -> Dict:
    _check_task(model, "detection", "classify")
    inputs, rows = await _infer(request, model)
    # decoded images carry the size they had before resizing
    originals = [cast("Tuple[int, int]", i.original) for i in inputs]
    results = detection_results(rows, originals, model.labels, threshold, max_detections,
                                box_format)
    return {"model": model.name, "results": results}


def _check_task(model: ServedModel, task: str, other: str) -> None:
    if model.task != task:
        raise ServeError(400, f"model {model.name} is a {model.task} model; use "
                         f"/v1/models/{model.name}/{other}")


async def _infer(request: Request, model: ServedModel) -> Tuple[List[Input], List[Dict]]:
    """The request's images read, then the model's one pass: count, room, decode, batch."""
    settings = app_state(request).settings
    with span("read_body"):
        blobs = await read_images(request, settings.max_images, settings.max_body_bytes)
    try:
        return await model.infer_images(blobs)
    except ImageError as exc:  # PIL names the in-memory file object; drop that noise
        raise ServeError(400, _FILE_OBJECT.sub("", str(exc))) from None
