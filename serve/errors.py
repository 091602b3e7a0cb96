"""HTTP errors of the server: every failure is a JSON body ``{"error": message}``."""
from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

__all__ = ["ServeError", "ErrorBody", "error_responses", "install_handlers", "unavailable",
           "validation_message", "body_error", "CLIENT_CLOSED_REQUEST"]

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that hung up before the answer

log = logging.getLogger("irpe.serve")

_DESCRIPTIONS = {
    400: "undecodable or invalid input (image, tensor, parameters)",
    401: "missing or wrong bearer token",
    404: "unknown model",
    413: "request body or image too large",
    415: "unsupported media type",
    422: "request does not match the schema",
    500: "inference failed",
    503: "model not ready, queue full or shutting down (see Retry-After)",
    504: "inference did not finish within the model's timeout",
}


class ServeError(Exception):
    """An error with its HTTP status; rendered as ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


class ErrorBody(BaseModel):
    """Body of every error response."""

    error: str


def error_responses(*codes: int) -> Dict[Union[int, str], Dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given status codes."""
    return {c: {"model": ErrorBody, "description": _DESCRIPTIONS[c]} for c in codes}


def unavailable(message: str, retry_after: int = 1) -> ServeError:
    """503 with a Retry-After header (not ready, queue full, shutting down)."""
    return ServeError(503, message, {"Retry-After": str(retry_after)})


def _json(status: int, message: str, headers: Optional[Dict[str, str]] = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
    return _json(exc.status, exc.message, exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return _json(exc.status_code, str(exc.detail), getattr(exc, "headers", None))


def validation_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """Pydantic / FastAPI validation errors as one line: ``field: message; ...``."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "body"))
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(parts) or "invalid request"


def body_error(exc: ValidationError) -> ServeError:
    """A request body that failed validation: 400 if it is not JSON at all, 422 otherwise."""
    errors = exc.errors()
    status = 400 if any(e["type"] == "json_invalid" for e in errors) else 422
    return ServeError(status, validation_message(errors))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _json(422, validation_message(exc.errors()))


async def _client_disconnected(request: Request, exc: ClientDisconnect) -> Response:
    """The client hung up while its body was read: not a server error. Nothing reaches it
    (uvicorn drops the response); the access log and metrics record 499, as nginx does."""
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", extra={"path": request.url.path})
    return _json(500, f"internal error: {type(exc).__name__}")


def install_handlers(app: FastAPI) -> None:
    """Route every error type to the JSON error body."""
    # Starlette types a handler as taking any Exception; it calls each with the type it is
    # registered for, so these narrower handlers are right (its stub cannot say so)
    app.add_exception_handler(ServeError, _serve_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _client_disconnected)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
