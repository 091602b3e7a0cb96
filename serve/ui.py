"""The playground page ``/ui`` (linked from ``/``): pick a served model, drop an image, see the
top classes as bars or the boxes on the image (docs/ui.md).

The page is three static files shipped as package data (``serve/ui.html``, ``ui.css``,
``ui.js``; plain HTML/CSS/JS, no build step, no CDN). It calls only the public REST routes
(``/v1/models``, ``/v1/models/{name}/classify|detect``) with relative URLs, so it works under a
path prefix (Ray Serve's ``route_prefix``) and goes through the same auth, body limit and CORS
as any client: the page itself is public, inference needs the API key where ``auth_token`` is
set. The HTML carries the few settings the page needs (auth on, body limit) as a JSON block;
a Content-Security-Policy limits every fetch, script, style and image to the server itself.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Dict

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

import irpe

from .config import ServeSettings

__all__ = ["UI_PATH", "UI_ASSETS", "SECURITY_HEADERS", "install_ui", "page_html"]

UI_PATH = "/ui"
UI_ASSETS = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}
# nothing but this server: images shown from blob: URLs of the user's own file
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_CONFIG = "{{IRPE_UI_CONFIG}}"


def _asset(name: str) -> str:
    """A file of the page, next to this module (package data: wheel, Docker image, checkout;
    serve/ is a namespace package, which importlib.resources cannot read on Python 3.11)."""
    return (Path(__file__).parent / name).read_text(encoding="utf-8")


def page_html(settings: ServeSettings) -> str:
    """ui.html with the settings the page shows or checks before sending: whether inference
    needs an API key, and the body limit (never the token itself)."""
    config = {"auth": settings.auth_token is not None, "max_body_bytes": settings.max_body_bytes,
              "version": irpe.__version__}
    text = json.dumps(config).replace("<", "\\u003c")  # inert inside <script type=json>
    return _asset("ui.html").replace(_CONFIG, text)


def _index_html(ui: bool) -> str:
    """``/``: where to go from the server's root (relative links: a path prefix is kept)."""
    links = [("ui", "Playground: drop an image, see the answer")] if ui else []
    links += [("docs", "API reference (Swagger UI)"), ("redoc", "API reference (ReDoc)"),
              ("v1/models", "Served models (JSON)"), ("metrics", "Prometheus metrics")]
    items = "".join(f'<li><a href="{href}">{html.escape(text)}</a></li>' for href, text in links)
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            'content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
            f'<title>irpe-serve {irpe.__version__}</title></head><body><h1>irpe-serve '
            f'{irpe.__version__}</h1><ul>{items}</ul></body></html>')


def install_ui(app: FastAPI, settings: ServeSettings) -> None:
    """``GET /`` (links) always; ``GET /ui`` and its two assets unless ``settings.ui`` is off.
    None of them is in the OpenAPI document: they are pages, not API."""
    index = _index_html(settings.ui)

    async def root() -> HTMLResponse:
        return HTMLResponse(index, headers=SECURITY_HEADERS)

    app.add_api_route("/", root, methods=["GET", "HEAD"], include_in_schema=False)
    if not settings.ui:
        return
    page = page_html(settings)
    assets: Dict[str, bytes] = {name: _asset(name).encode() for name in UI_ASSETS}

    async def ui() -> HTMLResponse:
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    app.add_api_route(UI_PATH, ui, methods=["GET", "HEAD"], include_in_schema=False)
    for name, media_type in UI_ASSETS.items():
        app.add_api_route(f"{UI_PATH}/{name}", _asset_route(assets[name], media_type),
                          methods=["GET", "HEAD"], include_in_schema=False)


def _asset_route(body: bytes, media_type: str):
    async def asset() -> Response:
        return Response(body, media_type=media_type, headers=SECURITY_HEADERS)
    return asset
