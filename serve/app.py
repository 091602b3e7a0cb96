"""The FastAPI application: models from settings, lifespan (load, warm up, drain), routes."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Dict, List, Type

from fastapi import FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

import irpe
from irpe.errors import GPURequired, InvalidInput
from irpe.fused.dispatch import set_fused_attention
from irpe.idcache import BUCKET_IDS

from .config import ServeSettings
from .docs import install_docs
from .errors import ErrorBody, install_handlers
from .inputs import ImagesJSON
from .metrics import CONTENT_TYPE, Metrics
from .middleware import BodyLimitMiddleware, ObserveMiddleware
from .model import ServedModel
from .preprocess_pool import set_decode_threads
from .rest import router as rest_router
from .state import AppState, app_state
from .tracing import setup_tracing
from .ui import install_ui
from .v2 import router as v2_router
from .v2codec import InferRequest

__all__ = ["create_app", "build_models", "cuda_device_count"]

log = logging.getLogger("irpe.serve")


def build_models(settings: ServeSettings, metrics: Metrics) -> Dict[str, ServedModel]:
    """Validate every model config (files, metadata, labels) without loading weights."""
    if not settings.models:
        raise InvalidInput("no models configured (repository file, IRPE_SERVE_MODELS or --demo)")
    names = settings.model_names()
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidInput(f"model names used twice: {', '.join(duplicates)}")
    for m in settings.models:
        _check_device(m.name, m.device)
    models = {m.name: ServedModel(m, metrics, settings.threads, settings.max_images,
                                  settings.gc_freeze)
              for m in settings.models}
    _check_defaults(settings, models)
    return models


def cuda_device_count() -> int:
    """CUDA devices torch can use here (0 without CUDA or with a CPU-only build)."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_device(name: str, device: str) -> None:
    """A model on a CUDA device this machine lacks is refused at start (GPURequired: one line,
    exit 2), like an unknown device, rather than a model that never turns ready."""
    if not device.startswith("cuda"):
        return
    index, count = int(device.partition(":")[2] or 0), cuda_device_count()
    if index < count:
        return
    have = ("no CUDA device (torch.cuda.is_available() is False)" if count == 0 else
            f"{count} CUDA device{'s' if count > 1 else ''} (cuda:0..cuda:{count - 1})")
    raise GPURequired(f"model {name}: device {device} requested, but this machine has {have}; "
                      "serve it with device: cpu")


def _check_defaults(settings: ServeSettings, models: Dict[str, ServedModel]) -> None:
    """default_classifier / default_detector must name a served model of that task."""
    for key, task in (("default_classifier", "classification"),
                      ("default_detector", "detection")):
        name = getattr(settings, key)
        if name is None:
            continue
        if name not in models:
            raise InvalidInput(f"{key} {name!r} is not a configured model; configured: "
                               f"{', '.join(models)}")
        if models[name].task != task:
            raise InvalidInput(f"{key} {name!r} is a {models[name].task} model, not {task}")


def create_app(settings: ServeSettings, load_before_serving: bool = False) -> FastAPI:
    """An app serving ``settings.models``. Models load in the background after startup (the
    server answers health checks, 503 until ready), or, with ``load_before_serving``, before
    the lifespan's startup completes: a Ray Serve replica (serve.ray) counts as started, and
    gets traffic, only once its models are loaded and warmed up."""
    metrics = Metrics()
    state = AppState(settings, build_models(settings, metrics), metrics)
    tracing = setup_tracing(settings)  # None unless traces are asked for
    if settings.bucket_cache_mib is not None:  # one cache per process (irpe.idcache)
        BUCKET_IDS.set_limit(int(settings.bucket_cache_mib * (1 << 20)))
    set_decode_threads(settings.decode_threads)  # process-wide too
    if settings.fused_attention is not None:
        set_fused_attention(settings.fused_attention)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = [asyncio.create_task(m.start()) for m in state.models.values()]
        if load_before_serving:
            await asyncio.gather(*loading)
        yield
        state.stopping = True
        await asyncio.gather(*loading)
        await asyncio.gather(*(m.stop() for m in state.models.values()))
        log.info("stopped; queued requests drained")
        if tracing is not None:  # after the models: their last spans are exported
            await asyncio.to_thread(tracing.shutdown)

    app = FastAPI(title="irpe-serve", version=irpe.__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # install_docs: offline assets
                  description="iRPE vision transformers: REST and Open Inference Protocol v2. "
                  "Every error is a JSON body {\"error\": message}.")
    app.state.irpe = state
    install_handlers(app)
    install_docs(app)
    install_ui(app, settings)
    app.include_router(rest_router)
    app.include_router(v2_router)
    app.add_api_route("/metrics", _metrics, methods=["GET"], tags=["Operations"],
                      response_class=Response, summary="Prometheus metrics", responses={
                          200: {"content": {CONTENT_TYPE.split(";")[0]: {}}}})
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(ObserveMiddleware, metrics=metrics, tracing=tracing)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST"], allow_headers=["*"])
    # FastAPI's documented way to customise the schema; its class declares openapi a method
    app.openapi = lambda: _openapi(  # type: ignore[method-assign]
        app, [ImagesJSON, InferRequest, ErrorBody], settings.auth_token is not None)
    return app


async def _metrics(request: Request) -> Response:
    """Prometheus text format: requests, latency, in-flight, queue/compute time, batch sizes."""
    return Response(app_state(request).metrics.render(), media_type=CONTENT_TYPE)


def _openapi(app: FastAPI, models: List[Type[BaseModel]], has_token: bool) -> Dict:
    """The generated schema plus the bodies the routes parse themselves; bearer security only
    where the server enforces it (a token is configured)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                             description=app.description)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        _errors_are_error_bodies(schema)
        if not has_token:
            _without_security(schema)
        app.openapi_schema = schema
    return app.openapi_schema


def _errors_are_error_bodies(schema: Dict) -> None:
    """FastAPI documents its own 422 body; ours is ErrorBody like every other error."""
    ref = {"$ref": "#/components/schemas/ErrorBody"}
    for operations in schema["paths"].values():
        for op in operations.values():
            if "422" in op.get("responses", {}):
                op["responses"]["422"] = {"description": "request does not match the schema",
                                          "content": {"application/json": {"schema": ref}}}
    for name in ("HTTPValidationError", "ValidationError"):
        schema["components"]["schemas"].pop(name, None)


def _without_security(schema: Dict) -> None:
    """No token configured: inference is open, so no operation declares a security scheme and
    none answers 401."""
    for operations in schema["paths"].values():
        for op in operations.values():
            if op.pop("security", None) is not None:
                op.get("responses", {}).pop("401", None)
    schema["components"].pop("securitySchemes", None)
