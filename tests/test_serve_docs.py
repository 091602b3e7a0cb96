"""/docs and /redoc render offline: headless Chromium (every other host unresolvable) loads the
pages from a real server, and the rendered DOM lists every operation of the OpenAPI document.

Skips where no Chromium is installed, except in CI (CI=true), which installs it (.ci/run)."""
from __future__ import annotations

import html
import re
import subprocess

import httpx
import pytest

from serve.config import ServeSettings
from tests.cdp import FLAGS
from tests.cdp import find_browser as _browser
from tests.helpers import running_server


@pytest.fixture(scope="module")
def docs_server(files):
    settings = ServeSettings(threads=1, log_level="error", models=[
        {"name": "cls", "path": files["cls"]}, {"name": "det", "path": files["det"]}])
    with running_server(settings, ready=False) as base:
        yield base


def dump_dom(browser: str, url: str, profile) -> str:
    """The DOM after scripts ran (virtual time), from a fresh profile."""
    done = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}",
                           "--virtual-time-budget=15000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def operations(url: str) -> set:
    spec = httpx.get(f"{url}/openapi.json").json()
    return {(method.upper(), path, op["operationId"])
            for path, ops in spec["paths"].items() for method, op in ops.items()}


def test_swagger_ui_lists_every_operation_offline(docs_server, tmp_path):
    browser = _browser()
    page = httpx.get(f"{docs_server}/docs").text
    assert "cdn." not in page and "/docs-assets/swagger-ui-bundle.js" in page
    dom = dump_dom(browser, f"{docs_server}/docs", tmp_path / "profile")
    shown = {(m, html.unescape(p)) for m, p in re.findall(
        r'opblock-summary-method">(\w+)</span>.*?data-path="([^"]+)"', dom)}
    wanted = {(method, path) for method, path, _ in operations(docs_server)}
    assert wanted and shown == wanted, (wanted - shown, shown - wanted)


def test_redoc_lists_every_operation_offline(docs_server, tmp_path):
    browser = _browser()
    page = httpx.get(f"{docs_server}/redoc").text
    assert "cdn." not in page and "fonts.googleapis" not in page
    dom = dump_dom(browser, f"{docs_server}/redoc", tmp_path / "profile")
    shown = set(re.findall(r'data-section-id="[^"]*operation/([^"]+)"', dom))
    wanted = {op_id for _, _, op_id in operations(docs_server)}
    assert wanted and shown == wanted, (wanted - shown, shown - wanted)


def test_docs_assets_are_served_from_the_installed_package(docs_server):
    for name, kind in (("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "css"),
                       ("redoc.standalone.js", "javascript")):
        r = httpx.get(f"{docs_server}/docs-assets/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
        assert len(r.content) > 100_000
    assert httpx.get(f"{docs_server}/docs-assets/../serve/app.py").status_code == 404
