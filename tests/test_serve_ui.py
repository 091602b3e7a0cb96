"""The playground page /ui in a real headless Chromium against a real `irpe serve --demo`: the
answers it shows equal the REST answers for the same image, the detector's slider redraws
without a request, 4xx bodies are shown, auth needs the key, only the server is contacted, the
page is small, readable at 360 and 1440 px and usable from the keyboard; `ui: false` leaves no
page. Skips without Chromium, except in CI (CI=true), which installs it (.ci/run)."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

import httpx
import pytest

from serve.config import ServeSettings
from serve.ui import UI_ASSETS
from tests.cdp import Browser, Page, find_browser
from tests.helpers import ROOT, running_server
from tests.ui_page import (
    CLASSIFIER,
    DETECTOR,
    demo_server,
    open_ui,
    pick_model,
    sample_images,
    send_and_fail,
    send_image,
)

TOKEN = "ui-test-token-3f9a"
PAGE_BUDGET = 200_000  # bytes: the page, its stylesheet and its script
OKABE_ITO = {"rgb(230, 159, 0)", "rgb(86, 180, 233)", "rgb(0, 158, 115)", "rgb(240, 228, 66)",
             "rgb(0, 114, 178)", "rgb(213, 94, 0)", "rgb(204, 121, 167)", "rgb(0, 0, 0)"}
BOXES = ("[...document.querySelectorAll('#boxes .box')]"
         ".map(b => [b.dataset.label, Number(b.dataset.score)])")
ROWS = ("[...document.querySelectorAll('#detections tbody tr')]"
        ".map(r => [r.dataset.label, Number(r.dataset.score)])")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Browser(find_browser(), tmp_path_factory.mktemp("chromium"))
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def server():
    with demo_server() as url:
        yield url


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Dict[str, Path]:
    return sample_images(tmp_path_factory.mktemp("images"))


def post(url: str, model: str, task: str, image: Path, token: str = "", **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/v1/models/{model}/{task}", params=params, headers=headers,
                      files={"file": (image.name, image.read_bytes())}, timeout=120)


def detections(url: str, image: Path, threshold: float) -> List[Tuple[str, float]]:
    """The REST answer for ``image`` at ``threshold``: (label, score), best first."""
    r = post(url, DETECTOR, "detect", image, threshold=threshold, max_detections=100)
    assert r.status_code == 200, r.text
    return [(d["label"], d["score"]) for d in r.json()["results"][0]["detections"]]


def set_threshold(page: Page, value: float) -> None:
    page.evaluate(f"(s => {{ s.value = '{value}'; s.dispatchEvent(new Event('input')); }})"
                  "(document.getElementById('threshold'))")


def posts(page: Page) -> List[str]:
    return [r["url"] for r in page.requests() if r["method"] == "POST"]


def assert_only_the_server(page: Page, url: str) -> None:
    """Every request in the tab's network log went to the server (blob: is the picked file),
    and the page threw nothing and broke no rule of its Content-Security-Policy."""
    assert page.errors() == []
    requests = page.requests()
    assert requests
    for request in requests:
        parts = urlsplit(request["url"])
        if parts.scheme in ("blob", "data"):
            continue
        assert (parts.scheme, parts.netloc) == ("http", urlsplit(url).netloc), request["url"]


def visible(page: Page, element_id: str) -> bool:
    """Whether the element is laid out on screen (not just without a hidden attribute)."""
    return page.evaluate(f"document.getElementById('{element_id}').getClientRects().length > 0")


def shown_pairs(page: Page, script: str) -> List[Tuple[str, float]]:
    return [(label, score) for label, score in page.evaluate(script)]


def shown_labels(page: Page) -> List[str]:
    """The classes the page lists, in its order."""
    return page.evaluate("[...document.querySelectorAll('#classes li')]"
                         ".map(li => li.dataset.label)")


def test_root_links_the_page_which_is_small_and_self_contained(browser, server):
    assert 'href="ui"' in httpx.get(f"{server}/").text
    page = open_ui(browser, server)
    assert not visible(page, "result") and not visible(page, "error")  # nothing sent yet
    assert not visible(page, "key")  # auth is off
    loaded = {urlsplit(r["url"]).path for r in page.requests()}
    assert loaded == {"/ui", "/ui/ui.css", "/ui/ui.js", "/v1/models"}
    weight = 0
    for path in ["/ui", *(f"/ui/{name}" for name in UI_ASSETS)]:
        r = httpx.get(f"{server}{path}")
        assert r.status_code == 200 and "connect-src 'self'" in r.headers["content-security-policy"]
        assert not re.search(r"(https?:)?//[a-z0-9]", r.text, re.I), f"{path} names another host"
        weight += len(r.content)
    assert weight < PAGE_BUDGET, weight
    spec = httpx.get(f"{server}/openapi.json").json()
    assert not {"/", "/ui"} & set(spec["paths"])  # pages, not API operations
    assert_only_the_server(page, server)
    page.close()


def test_classifier_bars_equal_the_rest_answer(browser, server, images):
    page = open_ui(browser, server)
    pick_model(page, CLASSIFIER)
    send_image(page, images["star"], CLASSIFIER)
    assert visible(page, "classes") and not visible(page, "detections")
    shown = page.evaluate("[...document.querySelectorAll('#classes li')].map(li => "
                          "[li.dataset.label, Number(li.dataset.score), "
                          "li.querySelector('.score').textContent])")
    rest = post(server, CLASSIFIER, "classify", images["star"], top_k=5).json()["results"][0]
    assert [s[0] for s in shown] == rest["labels"] and rest["labels"][0] == "star"
    assert [s[1] for s in shown] == rest["scores"]
    assert [s[2] for s in shown] == [f"{s:.3f}" for s in rest["scores"]]
    model = next(m for m in httpx.get(f"{server}/v1/models").json() if m["name"] == CLASSIFIER)
    meta = page.evaluate("document.getElementById('meta').textContent")
    assert f"backend {model['backend']}" in meta and f"precision {model['precision']}" in meta
    assert re.search(r"\b\d+ ms round trip", meta), meta
    # fewer classes: a new request, answered as REST answers top_k=3
    page.evaluate("(t => { t.value = '3'; t.dispatchEvent(new Event('change')); })"
                  "(document.getElementById('topk'))")
    page.wait_for("document.querySelectorAll('#classes li').length === 3")
    top3 = post(server, CLASSIFIER, "classify", images["star"], top_k=3).json()["results"][0]
    assert shown_labels(page) == top3["labels"]
    assert_only_the_server(page, server)
    page.close()


def test_detector_boxes_follow_the_threshold_without_a_request(browser, server, images):
    scene = images["scene"]
    page = open_ui(browser, server)
    pick_model(page, DETECTOR)
    send_image(page, scene, DETECTOR)
    assert visible(page, "detections") and not visible(page, "classes")
    assert len(posts(page)) == 1
    counts = []
    for threshold in (0.5, 0.95, 0.2):
        set_threshold(page, threshold)
        want = detections(server, scene, threshold)
        assert shown_pairs(page, BOXES) == want == shown_pairs(page, ROWS), threshold
        counts.append(len(want))
    assert len(set(counts)) > 1, counts  # the slider changed what is drawn
    # keyboard: End and Home move the slider to 1 and 0
    page.evaluate("document.getElementById('threshold').focus()")
    for key, threshold in (("End", 1.0), ("Home", 0.0)):
        page.key(key)
        assert float(page.evaluate("document.getElementById('threshold').value")) == threshold
        assert shown_pairs(page, BOXES) == detections(server, scene, threshold), key
    assert len(posts(page)) == 1, posts(page)  # every redraw came from the one answer
    set_threshold(page, 0.5)
    first = detections_xyxy(server, scene)[0]
    rect = page.evaluate("(() => { const b = document.querySelector('#boxes .box')"
                         ".getBoundingClientRect(), img = document.getElementById('preview'), "
                         "i = img.getBoundingClientRect(); return [b.left - i.left, "
                         "b.top - i.top, b.right - i.left, b.bottom - i.top, "
                         "i.width / img.naturalWidth]; })()")
    scale = rect[4]  # CSS pixels per image pixel
    assert all(abs(px / scale - want) < 1.0 for px, want in zip(rect[:4], first, strict=True))
    colours = page.evaluate("[...document.querySelectorAll('#boxes .box')]"
                            ".map(b => getComputedStyle(b).borderTopColor)")
    assert colours and set(colours) <= OKABE_ITO, colours
    assert_only_the_server(page, server)
    page.close()


def detections_xyxy(url: str, image: Path) -> List[List[float]]:
    r = post(url, DETECTOR, "detect", image, threshold=0.5, max_detections=100)
    return [d["box"] for d in r.json()["results"][0]["detections"]]


@pytest.mark.parametrize("width", [360, 1440])
def test_readable_at_phone_and_desktop_widths(browser, server, images, width):
    page = open_ui(browser, server, width)
    pick_model(page, DETECTOR)
    send_image(page, images["scene"], DETECTOR)
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scroll
    request, answer = page.evaluate("['.controls', '.output'].map(s => { const r = document"
                                    ".querySelector(s).getBoundingClientRect(); "
                                    "return [r.left, r.top, r.right, r.bottom]; })")
    if width == 360:  # one column: the answer below the request
        assert answer[1] >= request[3]
    else:  # side by side
        assert answer[0] >= request[2] and answer[1] < request[3]
    assert page.evaluate("Math.min(...[...document.querySelectorAll('body *')]"
                         ".filter(e => e.offsetParent && e.childNodes.length && "
                         "[...e.childNodes].some(n => n.nodeType === 3 && n.data.trim()))"
                         ".map(e => parseFloat(getComputedStyle(e).fontSize)))") >= 12
    page.close()


def test_keyboard_reaches_every_control(browser, server, images):
    page = open_ui(browser, server)
    pick_model(page, CLASSIFIER)
    send_image(page, images["star"], CLASSIFIER)  # Send is enabled once there is an image
    page.evaluate("document.activeElement.blur()")
    reached = []
    for _ in range(12):
        page.key("Tab")
        reached.append(page.evaluate("document.activeElement.id || "
                                     "document.activeElement.tagName"))
    assert {"model", "file", "topk", "run"} <= set(reached), reached
    page.close()


def test_dropped_and_pasted_images_are_sent(browser, server, images):
    """Drag and drop (the browser's own drag events), then paste (a paste event carrying the
    file, as the clipboard gives a copied image): each answer equals REST's."""
    page = open_ui(browser, server)
    pick_model(page, DETECTOR)
    page.drop_files("#drop", [images["scene"]])
    page.wait_for("document.getElementById('result').dataset.image === 'scene.png'", 120)
    assert shown_pairs(page, BOXES) == detections(server, images["scene"], 0.5)
    pick_model(page, CLASSIFIER)  # sends the scene to the classifier; then paste the star
    data = base64.b64encode(images["star"].read_bytes()).decode()
    page.evaluate(f"(() => {{ const bytes = Uint8Array.from(atob('{data}'), c => "
                  "c.charCodeAt(0)), t = new DataTransfer(); t.items.add(new File([bytes], "
                  "'image.png', {type: 'image/png'})); document.dispatchEvent(new "
                  "ClipboardEvent('paste', {clipboardData: t})); })()")
    page.wait_for("(r => r.dataset.image === 'image.png' && r.dataset.model === "
                  f"'{CLASSIFIER}')(document.getElementById('result'))", 120)
    rest = post(server, CLASSIFIER, "classify", images["star"], top_k=5).json()["results"][0]
    assert shown_labels(page) == rest["labels"]
    assert_only_the_server(page, server)
    page.close()


def test_an_image_over_the_body_limit_is_not_sent(browser, files, images):
    settings = ServeSettings(threads=1, log_level="error", max_body_bytes=4096,
                             models=[{"name": "cls", "path": files["cls"]}])
    with running_server(settings) as url:
        page = open_ui(browser, url)
        size = images["star"].stat().st_size
        assert size > 4096
        shown = send_and_fail(page, images["star"])
        assert f"the image is {size} bytes, over this server's limit of 4096 bytes" in shown
        assert posts(page) == []  # refused in the page; the server would answer 413
        r = post(url, "cls", "classify", images["star"])
        assert r.status_code == 413 and "4096" in r.json()["error"]
        page.close()


def test_a_4xx_body_is_shown_as_the_api_states_it(browser, server, images):
    page = open_ui(browser, server)
    pick_model(page, CLASSIFIER)
    shown = send_and_fail(page, images["text"])
    r = post(server, CLASSIFIER, "classify", images["text"], top_k=5)
    assert r.status_code == 400
    assert "HTTP 400" in shown and r.json()["error"] in shown, shown
    assert visible(page, "error") and not visible(page, "result")
    page.close()


def test_with_auth_no_answer_without_the_key(browser, images):
    with demo_server(auth_token=TOKEN) as url:
        html = httpx.get(f"{url}/ui").text
        assert TOKEN not in html and '"auth": true' in html
        page = open_ui(browser, url)
        assert page.evaluate("!document.getElementById('key-field').hidden")
        pick_model(page, CLASSIFIER)
        shown = send_and_fail(page, images["star"])
        assert "HTTP 401" in shown and "missing or invalid bearer token" in shown, shown
        assert "needs an API key" in shown
        assert page.evaluate("document.querySelectorAll('#classes li').length") == 0
        assert visible(page, "key") and not visible(page, "result")
        page.evaluate("document.getElementById('key').focus()")
        page.type_text(TOKEN)
        page.key("Enter")  # sends again, now with the key
        page.wait_for("!document.getElementById('result').hidden", timeout=120)
        assert visible(page, "result") and not visible(page, "error")
        rest = post(url, CLASSIFIER, "classify", images["star"], token=TOKEN, top_k=5)
        assert shown_labels(page) == rest.json()["results"][0]["labels"]
        statuses = [r["status"] for r in page.responses() if "/classify" in r["url"]]
        assert statuses == [401, 200], statuses
        assert_only_the_server(page, url)
        page.close()


def test_ui_off_leaves_no_page(files):
    assert ServeSettings().ui is True
    settings = ServeSettings(threads=1, log_level="error", ui=False,
                             models=[{"name": "cls", "path": files["cls"]}])
    with running_server(settings, ready=False) as url:
        for path in ["/ui", *(f"/ui/{name}" for name in UI_ASSETS)]:
            r = httpx.get(f"{url}{path}")
            assert r.status_code == 404 and "error" in r.json(), path
        root = httpx.get(f"{url}/")
        assert root.status_code == 200 and 'href="ui"' not in root.text
        assert 'href="docs"' in root.text


def test_the_page_files_are_package_data():
    """The wheel and the Docker image (a non-editable install) carry the page's files."""
    import tomllib
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["serve"]
    assert {"ui.html", *UI_ASSETS} <= set(shipped)
    assert all((ROOT / "serve" / name).is_file() for name in shipped)


def test_page_config_carries_auth_and_limit_never_the_token():
    from serve.ui import page_html
    settings = ServeSettings(auth_token=TOKEN, max_body_bytes=4096)
    text = page_html(settings)
    found = re.search(r'id="irpe-config" type="application/json">(.*?)</script>', text)
    assert found is not None
    config = json.loads(found.group(1))
    assert config["auth"] is True and config["max_body_bytes"] == 4096
    assert TOKEN not in text and "{{" not in text


@pytest.mark.timeout(300)
def test_behind_ray_serve_under_a_route_prefix(browser, images):
    """The same app as a Ray Serve replica behind Ray's proxy at /irpe: the page's relative
    URLs keep the prefix, and its answer equals the REST answer there."""
    pytest.importorskip("ray.serve")
    with demo_server("--ray", RAY='{"route_prefix": "/irpe"}') as url:
        assert url.endswith("/irpe")
        page = open_ui(browser, url)
        pick_model(page, DETECTOR)
        send_image(page, images["scene"], DETECTOR)
        assert shown_pairs(page, BOXES) == detections(url, images["scene"], 0.5)
        paths = {urlsplit(r["url"]).path for r in page.requests() if r["url"].startswith("http")}
        assert paths == {"/irpe/ui", "/irpe/ui/ui.css", "/irpe/ui/ui.js", "/irpe/v1/models",
                         f"/irpe/v1/models/{DETECTOR}/detect"}
        assert_only_the_server(page, url)
        page.close()
