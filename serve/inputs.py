"""Images from a REST request: multipart file(s), a raw image body, or JSON base64."""
from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, List

from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request

from .errors import ServeError, body_error
from .inflate import CODINGS, inflate

__all__ = ["ImagesJSON", "RAW_IMAGE_TYPES", "CODINGS", "media_type", "content_codings",
           "read_body", "read_images", "image_request_body"]

RAW_IMAGE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/gif",
                   "image/tiff")


class ImagesJSON(BaseModel):
    """JSON body: base64 images (plain or ``data:image/...;base64,`` URLs)."""

    images: List[str] = Field(min_length=1, description="base64-encoded image files")


def media_type(request: Request) -> str:
    """Content-Type without parameters, lower case ('' when absent)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def content_codings(request: Request) -> List[str]:
    """The body's Content-Encoding codings in the order they were applied (identity dropped);
    415 naming the accepted ones for any other coding. The one rule of /v1 and /v2."""
    value = request.headers.get("content-encoding", "")
    codings = [c.strip().lower() for c in value.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    for coding in codings:
        if coding not in CODINGS:
            raise ServeError(415, f"unsupported Content-Encoding {coding!r}: send identity, "
                             f"{' or '.join(CODINGS)}", {"Accept-Encoding": ", ".join(CODINGS)})
    return codings


async def read_body(request: Request, limit: int) -> bytes:
    """The request body with its Content-Encoding undone (415 checked before reading): inflated
    off the event loop as it streams in (serve.inflate: gzip members, 400 / 413)."""
    codings = content_codings(request)
    if not codings:
        return await request.body()
    return await inflate(request.stream(), codings, limit)


async def read_images(request: Request, max_images: int, limit: int) -> List[bytes]:
    """Encoded images of the request, in order, Content-Encoding undone (gzip/deflate, as on
    /v2); 415 for other media types or codings."""
    kind = media_type(request)
    if kind == "multipart/form-data":
        if content_codings(request):  # the form is parsed from the inflated body
            request = _replayed(request, await read_body(request, limit))
        return await _multipart(request, max_images)
    if kind in RAW_IMAGE_TYPES:
        return [await read_body(request, limit)]
    if kind == "application/json":
        return _decode_json(await read_body(request, limit))
    raise ServeError(415, f"unsupported media type {kind or '(none)'}: send multipart/form-data, "
                     f"{', '.join(RAW_IMAGE_TYPES)} or application/json")


def _replayed(request: Request, body: bytes) -> Request:
    """A request over the same scope whose body is ``body`` (already read and inflated)."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return Request(request.scope, receive)


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
    content: Dict[str, Dict[str, Any]] = {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"], "properties": {"file": {
            "type": "array", "minItems": 1, "items": {"type": "string", "format": "binary"}}},
        "description": "one or more file parts (any field name; at least one)"}}}
    content.update({t: binary for t in RAW_IMAGE_TYPES})
    content["application/json"] = {"schema": {"$ref": "#/components/schemas/ImagesJSON"}}
    return {"required": True, "content": content}
