"""The playground page /ui driven in headless Chromium (tests/cdp.py): a real `irpe serve --demo`,
the repository's test images (irpe.data.shapes, validation split, as in the README), and the
steps a person takes (open, pick a model, pick an image, wait for the answer).

Run as a script it writes the screenshots of docs/ui.md:
``.venv/bin/python -m tests.ui_page docs/img`` (ui-classify-*.png, ui-detect-*.png at 360 and
1440 px wide)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, Iterator

from benchmarks.ray_serve import free_port
from tests.cdp import Browser, Page, find_browser
from tests.helpers import ROOT, wait_ready

CLASSIFIER, DETECTOR = "deit_shapes_irpe", "detr_shapes_irpe"
WIDTHS = (360, 1440)


@contextlib.contextmanager
def demo_server(*flags: str, **settings: str) -> Iterator[str]:
    """`irpe serve --demo --port 0 FLAGS` in a process of its own, one thread per model;
    ``settings`` as IRPE_SERVE_* variables. Yields the URL of its "serving" line (with Ray
    Serve's route prefix under ``--ray``) once the models are ready; stops it after."""
    env = dict(os.environ, IRPE_SERVE_THREADS="1", IRPE_SERVE_LOG_LEVEL="info",
               IRPE_SERVE_LOG_FORMAT="json", IRPE_SERVE_DRAIN_GRACE_S="0",
               **{f"IRPE_SERVE_{k.upper()}": v for k, v in settings.items()})
    port = "0" if "--ray" not in flags else str(free_port())  # Ray's proxy binds it itself
    proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", "--demo", "--port", port,
                             *flags], stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, env=env, cwd=ROOT)
    try:
        url, seen = None, []
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("{") and json.loads(line)["message"] == "serving":
                url = json.loads(line)["url"].rstrip("/")
                break
        if url is None:
            raise AssertionError(f"irpe serve exited ({proc.wait()}): {''.join(seen[-8:])}")
        # keep reading its log, so a full pipe never blocks the server
        log = proc.stderr
        threading.Thread(target=lambda: all(True for _ in log), daemon=True).start()
        wait_ready(url, 300)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sample_images(folder: Path) -> Dict[str, Path]:
    """star.png and scene.png of the README's quick start, and a file that is no image."""
    from irpe.data.shapes import render_classification, render_detection
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"star": folder / "star.png", "scene": folder / "scene.png",
             "text": folder / "notes.png"}
    render_classification(5, 6, split="val")[0].save(paths["star"])
    render_detection(5, 3, split="val")[0].save(paths["scene"])
    paths["text"].write_bytes(b"these are notes, not an image\n")
    return paths


def open_ui(browser: Browser, url: str, width: int = 1440) -> Page:
    """A new tab on ``url``/ui, once its model list has loaded."""
    page = browser.page(width)
    page.goto(f"{url}/ui")
    page.wait_for("!document.getElementById('model').disabled")
    return page


def pick_model(page: Page, name: str) -> None:
    """Choose ``name`` in the model list (the select's change event, as a user's choice)."""
    page.evaluate(f"(() => {{ const s = document.getElementById('model'); "
                  f"s.value = {json.dumps(name)}; s.dispatchEvent(new Event('change')); }})()")
    assert page.evaluate("document.getElementById('model').value") == name


def send_image(page: Page, path: Path, model: str) -> None:
    """Pick ``path`` in the file input and wait until the answer of ``model`` for it shows."""
    page.set_files("#file", [path])
    page.wait_for(f"(r => !r.hidden && r.dataset.model === {json.dumps(model)} && "
                  f"r.dataset.image === {json.dumps(path.name)})"
                  "(document.getElementById('result'))", timeout=120)


def send_and_fail(page: Page, path: Path) -> str:
    """Pick ``path`` and wait for the error the page shows; its text."""
    page.set_files("#file", [path])
    return page.wait_for("(e => !e.hidden && e.textContent)(document.getElementById('error'))",
                         timeout=120)


def small_png(png: bytes) -> bytes:
    """The screenshot in 256 colours (a third of the bytes; the page has few colours)."""
    from PIL import Image
    with Image.open(io.BytesIO(png)) as image:
        buffer = io.BytesIO()
        image.convert("RGB").quantize(256).save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def screenshots(out: Path) -> None:
    """docs/img/ui-{classify,detect}-{360,1440}.png from a real demo server."""
    from irpe.atomic import write_bytes
    with tempfile.TemporaryDirectory() as tmp, demo_server() as url:
        images = sample_images(Path(tmp) / "images")
        browser = Browser(find_browser(), Path(tmp) / "profile")
        try:
            for task, model, image in (("classify", CLASSIFIER, "star"),
                                       ("detect", DETECTOR, "scene")):
                page = open_ui(browser, url)
                pick_model(page, model)
                send_image(page, images[image], model)
                for width in WIDTHS:
                    write_bytes(out / f"ui-{task}-{width}.png", small_png(page.screenshot(width)))
                page.close()
        finally:
            browser.close()


if __name__ == "__main__":
    screenshots(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
