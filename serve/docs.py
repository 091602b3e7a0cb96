"""/docs (Swagger UI) and /redoc from assets installed with the ``fastapi-offline`` package, so
the pages render on hosts without internet access (FastAPI's defaults load them from CDNs)."""
from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import cast

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "install_docs"]

ASSETS_URL = "/docs-assets"


def assets_dir() -> Path:
    """Folder of swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js and favicon.png."""
    return Path(str(importlib.resources.files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """Serve the bundled assets under ASSETS_URL and the two pages that use them (the app must
    be created with docs_url=None, redoc_url=None)."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    title, favicon = app.title, f"{ASSETS_URL}/favicon.png"
    # the schema's URL: create_app keeps FastAPI's /openapi.json (never None)

    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=cast(str, app.openapi_url), title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css", swagger_favicon_url=favicon)

    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=cast(str, app.openapi_url), title=f"{title} - ReDoc",
                              redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=favicon, with_google_fonts=False)

    app.add_api_route("/docs", swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)
