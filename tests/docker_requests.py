"""The requests tests/docker_probe.py sends to the container and to `irpe serve` outside it:
each returns something comparable (status + JSON, or a set of names), never timings."""
from __future__ import annotations

import hashlib
import re
import threading
from functools import lru_cache
from typing import Callable, Iterator, List, Optional, Tuple

import httpx
import numpy as np

from irpe.data.shapes import render_classification, render_detection
from tests.helpers import encode

Send = Callable[[httpx.Client, str], object]


@lru_cache(maxsize=None)
def images() -> dict:
    """The images of README and docs/serve.md: star.png, hexagon.jpg (val, seed 5), scene.png."""
    return {"star.png": encode(render_classification(5, 6, split="val")[0], "PNG"),
            "hexagon.jpg": encode(render_classification(5, 3, split="val")[0], "JPEG", quality=95),
            "scene.png": encode(render_detection(5, 3, split="val")[0], "PNG")}


def _json(r: httpx.Response) -> Tuple[int, object]:
    return r.status_code, r.json()


def classify_png(c: httpx.Client, url: str) -> Tuple[int, object]:
    return _json(c.post(f"{url}/v1/classify?top_k=3", content=images()["star.png"],
                        headers={"content-type": "image/png"}))


def classify_jpeg(c: httpx.Client, url: str) -> Tuple[int, object]:
    return _json(c.post(f"{url}/v1/classify?top_k=3", content=images()["hexagon.jpg"],
                        headers={"content-type": "image/jpeg"}))


def classify_multipart(c: httpx.Client, url: str) -> Tuple[int, object]:
    files = [("file", ("star.png", images()["star.png"], "image/png")),
             ("file", ("hexagon.jpg", images()["hexagon.jpg"], "image/jpeg"))]
    return _json(c.post(f"{url}/v1/models/deit_shapes_irpe/classify?top_k=2", files=files))


def detect(c: httpx.Client, url: str) -> Tuple[int, object]:
    return _json(c.post(f"{url}/v1/detect?threshold=0.5&box_format=coco",
                        files=[("file", ("scene.png", images()["scene.png"], "image/png"))]))


def drain_request(c: httpx.Client, url: str,
                  hold: Optional[threading.Event] = None) -> Tuple[int, object]:
    """A slow request (8 detector images) for the docker stop check. With ``hold`` the second
    half of its body is sent only once ``hold`` is set: the server has accepted it and runs it
    only after that, so it is in flight across whatever the caller does meanwhile."""
    files = [("file", (f"s{i}.png", encode(render_detection(7, i, size=256, split="val")[0]),
                       "image/png")) for i in range(8)]
    target = f"{url}/v1/models/detr_shapes_irpe/detect?threshold=0.3"
    if hold is None:
        return _json(c.post(target, files=files))
    built = c.build_request("POST", target, files=files)
    body = built.read()

    def chunks() -> Iterator[bytes]:
        yield body[:len(body) // 2]
        hold.wait(60)
        yield body[len(body) // 2:]
    return _json(c.post(target, content=chunks(),
                        headers={"content-type": built.headers["content-type"]}))


def v2_metadata(c: httpx.Client, url: str) -> Tuple[int, object]:
    return _json(c.get(f"{url}/v2/models/detr_shapes_irpe"))


def metric_names(c: httpx.Client, url: str) -> Tuple[int, object]:
    """/metrics: status and the metric families with samples per model (values differ)."""
    r = c.get(f"{url}/metrics")
    names = set(re.findall(r"^# TYPE (\S+) ", r.text, re.M))
    models = set(re.findall(r'irpe_batches_total\{[^}]*model="([^"]+)"', r.text))
    return r.status_code, sorted(names), sorted(models)


def playground(c: httpx.Client, url: str) -> Tuple[int, object]:
    """/ui and the two files it loads: shipped in the image as package data (docs/ui.md)."""
    page, *assets = [c.get(f"{url}/{path}") for path in ("ui", "ui/ui.css", "ui/ui.js")]
    return page.status_code, page.headers.get("content-type"), [
        (a.status_code, a.headers.get("content-type"), hashlib.sha256(a.content).hexdigest())
        for a in assets]


def docs(c: httpx.Client, url: str) -> Tuple[int, object]:
    """/docs (Swagger UI, served offline), the assets it names, and /openapi.json."""
    page = c.get(f"{url}/docs")
    assets = sorted(set(re.findall(r'(/docs-assets/[^"\']+)', page.text)))
    loaded = [(a, c.get(f"{url}{a}").status_code) for a in assets]
    return page.status_code, page.text, loaded, c.get(f"{url}/openapi.json").json()


CHECKS: List[Tuple[str, Send]] = [
    ("/v1/classify PNG", classify_png),
    ("/v1/classify JPEG", classify_jpeg),
    ("/v1/models/deit_shapes_irpe/classify multipart PNG + JPEG", classify_multipart),
    ("/v1/detect", detect),
    ("/v2/models/detr_shapes_irpe metadata", v2_metadata),
    ("/metrics families and models", metric_names),
    ("/docs page, its assets and /openapi.json", docs),
    ("/ui playground page and its assets (package data)", playground),
]


def error_checks() -> List[Tuple[str, Send]]:
    """Bad requests: (status, JSON body) of each."""
    def corrupt(c, url):
        return _json(c.post(f"{url}/v1/classify", content=images()["star.png"][:100],
                            headers={"content-type": "image/png"}))

    def media_type(c, url):
        return _json(c.post(f"{url}/v1/classify", content=b"hello",
                            headers={"content-type": "text/plain"}))

    def unknown_model(c, url):
        return _json(c.post(f"{url}/v1/models/nope/classify", content=images()["star.png"],
                            headers={"content-type": "image/png"}))

    def bad_tensor(c, url):
        body = {"inputs": [{"name": "images", "shape": [1, 3, 64, 64], "datatype": "FP32",
                            "data": [0.0] * 10}]}
        return _json(c.post(f"{url}/v2/models/deit_shapes_irpe/infer", json=body))
    return [("truncated PNG", corrupt), ("text/plain body", media_type),
            ("unknown model", unknown_model), ("v2 tensor of the wrong size", bad_tensor)]


def infer_v2(url: str) -> np.ndarray:
    """tritonclient.http: two preprocessed images, binary data, top-2 classification."""
    import tritonclient.http as httpclient

    from irpe.data import Preprocess, load_image
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    meta = client.get_model_metadata("deit_shapes_irpe")
    pre = Preprocess.from_dict(meta["parameters"]["preprocess"])
    batch = np.stack([pre(load_image(images()[f])).numpy()
                      for f in ("star.png", "hexagon.jpg")])
    inp = httpclient.InferInput("images", list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch, binary_data=True)
    out = httpclient.InferRequestedOutput("logits", binary_data=True, class_count=2)
    result = client.infer("deit_shapes_irpe", [inp], outputs=[out])
    client.close()
    return result.as_numpy("logits")
