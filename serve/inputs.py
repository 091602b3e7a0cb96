"""Images from a REST request: multipart file(s), a raw image body, or JSON base64."""
from __future__ import annotations

import base64
import binascii
from typing import List

from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request

from .errors import ServeError, body_error

__all__ = ["ImagesJSON", "RAW_IMAGE_TYPES", "media_type", "read_images", "image_request_body"]

RAW_IMAGE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/gif",
                   "image/tiff")


class ImagesJSON(BaseModel):
    """JSON body: base64 images (plain or ``data:image/...;base64,`` URLs)."""

    images: List[str] = Field(min_length=1, description="base64-encoded image files")


def media_type(request: Request) -> str:
    """Content-Type without parameters, lower case ('' when absent)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_images(request: Request, max_images: int) -> List[bytes]:
    """Encoded images of the request, in order; 415 for other media types."""
    kind = media_type(request)
    if kind == "multipart/form-data":
        return await _multipart(request, max_images)
    if kind in RAW_IMAGE_TYPES:
        return [await request.body()]
    if kind == "application/json":
        return _decode_json(await request.body())
    raise ServeError(415, f"unsupported media type {kind or '(none)'}: send multipart/form-data, "
                     f"{', '.join(RAW_IMAGE_TYPES)} or application/json")


async def _multipart(request: Request, max_images: int) -> List[bytes]:
    form = await request.form(max_files=max_images, max_fields=100)
    try:
        files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        if not files:
            raise ServeError(400, "multipart body has no file part")
        return [await f.read() for f in files]
    finally:
        await form.close()


def _decode_json(body: bytes) -> List[bytes]:
    try:
        images = ImagesJSON.model_validate_json(body).images
    except ValidationError as exc:
        raise body_error(exc) from None
    return [_b64(text, i) for i, text in enumerate(images)]


def _b64(text: str, index: int) -> bytes:
    if text.startswith("data:"):
        text = text.partition(",")[2]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ServeError(400, f"images[{index}] is not valid base64") from None


def image_request_body() -> dict:
    """OpenAPI requestBody of the classify/detect routes (the three accepted encodings)."""
    binary = {"schema": {"type": "string", "format": "binary"}}
    content = {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"], "properties": {"file": {
            "type": "array", "minItems": 1, "items": {"type": "string", "format": "binary"}}},
        "description": "one or more file parts (any field name; at least one)"}}}
    content.update({t: binary for t in RAW_IMAGE_TYPES})
    content["application/json"] = {"schema": {"$ref": "#/components/schemas/ImagesJSON"}}
    return {"required": True, "content": content}
