"""A real server (uvicorn on 127.0.0.1, torch backend, the bundled trained demo models) given
what users send: 16-bit and EXIF-rotated uploads, v2 tensors from the published preprocessing,
requests that time out in the queue (not failed batches); the bounded bucket cache in metrics."""
import logging

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from irpe.data.shapes import render_classification, render_detection
from irpe.data.transforms import Preprocess
from irpe.idcache import BUCKET_IDS
from irpe.models import model_info
from irpe.models.registry import bundled_weights
from serve.config import ServeSettings
from tests.helpers import encode, metric, running_server, wait_until

torch.set_num_threads(1)
CLS = bundled_weights(model_info("deit_shapes_irpe"))
DET = bundled_weights(model_info("detr_shapes_irpe"))
SLOW_FILL_MS = 200  # timed-out requests wait in a batch window this long: never run


@pytest.fixture(scope="module")
def url():
    """This module's server (conftest's ``client`` fixture talks to it)."""
    settings = ServeSettings(threads=1, log_level="warning", default_classifier="cls",
                             default_detector="det", models=[
                                 {"name": "cls", "path": CLS},
                                 {"name": "det", "path": DET},
                                 {"name": "wait", "path": CLS,
                                  "max_queue_delay_ms": SLOW_FILL_MS},
                                 {"name": "rest_to", "path": CLS, "timeout_s": 0.001,
                                  "max_queue_delay_ms": SLOW_FILL_MS}])
    with running_server(settings) as base:
        yield base


def test_16bit_star_is_a_star_over_rest(client):
    g8 = np.asarray(render_classification(7, 6, 64, "val")[0].convert("L"))
    body16 = encode(Image.fromarray(g8.astype(np.uint16) * 257))
    r16 = client.post("/v1/classify", content=body16, headers={"content-type": "image/png"})
    r8 = client.post("/v1/classify", content=encode(Image.fromarray(g8)),
                     headers={"content-type": "image/png"})
    assert r16.status_code == 200, r16.text
    top = r16.json()["results"][0]
    assert top["labels"][0] == "star"  # main: circle 0.80 (a white square)
    assert top["scores"] == r8.json()["results"][0]["scores"]


def test_exif_rotated_upload_detected_in_the_displayed_frame(client):
    scene = render_detection(7, 3, 128)[0]
    displayed = Image.new("RGB", (128, 200), (90, 90, 90))
    displayed.paste(scene, (0, 36))
    stored = displayed.transpose(Image.Transpose.ROTATE_90)  # 200 wide x 128 tall on disk
    exif = stored.getexif()
    exif[0x0112] = 6  # viewers rotate it 90 degrees clockwise: back to `displayed`
    answers = [client.post("/v1/detect?threshold=0.3", content=encode(img, **kw),
                           headers={"content-type": "image/png"}).json()["results"][0]
               for img, kw in ((stored, {"exif": exif.tobytes()}), (displayed, {}))]
    assert (answers[0]["height"], answers[0]["width"]) == (200, 128)  # main: 128, 200
    assert answers[0] == answers[1] and answers[0]["detections"]


def v2_images(client, model: str, array: np.ndarray, **parameters) -> httpx.Response:
    body = {"inputs": [{"name": "images", "shape": list(array.shape), "datatype": "FP32",
                        "data": array.ravel().tolist()}]}
    if parameters:
        body["parameters"] = parameters
    return client.post(f"/v2/models/{model}/infer", json=body)


@pytest.mark.parametrize("w,h", [(1003, 480), (100, 1000), (2000, 7)])
def test_v2_accepts_what_the_published_preprocessing_makes(client, w, h):
    meta = client.get("/v2/models/det").json()["parameters"]["preprocess"]
    x = Preprocess.from_dict(meta)(Image.new("RGB", (w, h), (40, 80, 120)))[None].numpy()
    r = v2_images(client, "det", x)
    assert r.status_code == 200, (x.shape, r.text)  # main: 400 "must be in 1..256"
    too_big = np.zeros((1, 3, 10, meta["max_size"] + 1), np.float32)
    assert v2_images(client, "det", too_big).status_code == 400


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _drained(url: str, model: str) -> None:
    wait_until(lambda: metric(url, "irpe_queue_depth", model=model) == 0, 30,
               f"queue of {model} empty")


def _timeouts_are_not_failures(url: str, model: str, send) -> None:
    """Every request times out (504) while its batch window fills. Once the queue is empty, one
    more timed-out request and an empty queue again prove the worker has finished the first
    window (it is sequential), whatever it did with it."""
    records = _Records()
    logger = logging.getLogger("irpe.serve")
    logger.addHandler(records)
    try:
        assert [send().status_code for _ in range(4)] == [504] * 4
        _drained(url, model)
        assert send().status_code == 504
        _drained(url, model)
    finally:
        logger.removeHandler(records)
    assert metric(url, "irpe_batches_total", model=model, outcome="failure") == 0
    assert metric(url, "irpe_batch_size_count", model=model) == 0  # no zero-image batch
    assert not [r for r in records.records if r.levelno >= logging.ERROR], records.records


def test_v2_timeouts_are_not_failed_batches(url, client):
    x = np.zeros((1, 3, 64, 64), np.float32)
    _timeouts_are_not_failures(url, "wait", lambda: v2_images(client, "wait", x, timeout=1))
    assert v2_images(client, "wait", x).status_code == 200  # and the model still serves
    assert metric(url, "irpe_batches_total", model="wait", outcome="success") == 1
    assert metric(url, "irpe_batch_size_sum", model="wait") == 1


def test_rest_timeouts_are_not_failed_batches(url, client):
    body = encode(render_classification(7, 1, 64, "val")[0])
    _timeouts_are_not_failures(url, "rest_to", lambda: client.post(
        "/v1/models/rest_to/classify", content=body, headers={"content-type": "image/png"}))


def test_bucket_cache_bounded_and_shown_in_metrics(url, client):
    limit = BUCKET_IDS.max_bytes
    assert metric(url, "irpe_bucket_cache_limit_bytes") == limit
    try:
        BUCKET_IDS.set_limit(100_000)
        BUCKET_IDS.clear()
        before = BUCKET_IDS.evictions
        for width in (208, 176, 144, 128):  # grids 8x13, 8x11, 8x9, 8x8: 86.5, 62, 41.5, 33 kB
            image = Image.new("RGB", (width, 128), (30, 60, 90))
            assert client.post("/v1/detect", content=encode(image),
                               headers={"content-type": "image/png"}).status_code == 200
        shown = metric(url, "irpe_bucket_cache_bytes")
        assert 0 < shown <= 100_000 and shown == BUCKET_IDS.nbytes
        assert BUCKET_IDS.evictions > before  # older grids dropped while serving
    finally:
        BUCKET_IDS.set_limit(limit)
