"""Server end to end: a real uvicorn on 127.0.0.1, REST + v2 over HTTP (httpx, tritonclient).

Models are the untrained demo architectures saved as trained-model files; results are checked
against the same artifact run directly in PyTorch with the shared Preprocess / PostProcess.
"""
from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch

from irpe.artifact.trained import load_trained
from irpe.data.shapes import SHAPE_CLASSES, render_classification, render_detection
from irpe.data.transforms import load_image
from irpe.models import PostProcess
from tests.helpers import encode, shape_png, wait_until

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def reference(files):
    """Direct PyTorch results of the same artifacts."""
    return {k: load_trained(v) for k, v in files.items()}


def classify_direct(reference, blob: bytes, k: int = 5):
    model, spec = reference["cls"]
    with torch.no_grad():
        logits = model(spec.transform()(load_image(blob))[None])
    return logits, logits.softmax(-1).topk(k)


# ---------------------------------------------------------------- REST classify / detect

def test_classify_raw_png_equals_direct_pytorch(client, reference):
    blob = shape_png(3, size=96)
    r = client.post("/v1/models/cls/classify?top_k=3", content=blob,
                    headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    _, (scores, indices) = classify_direct(reference, blob, 3)
    result = r.json()["results"][0]
    assert result["indices"] == indices[0].tolist()
    assert result["labels"] == [SHAPE_CLASSES[i] for i in result["indices"]]
    assert np.allclose(result["scores"], scores[0].numpy(), atol=1e-5)
    assert r.headers["x-request-id"]


def test_classify_multipart_batch_in_request_order(client):
    blobs = [shape_png(0), encode(render_classification(7, 1, 80)[0], "JPEG"),
             encode(render_classification(7, 2, 64)[0], "WEBP")]
    files = [("file", (f"{i}.img", b)) for i, b in enumerate(blobs)]
    r = client.post("/v1/models/cls/classify", files=files)
    assert r.status_code == 200, r.text
    batch = r.json()["results"]
    assert len(batch) == 3
    for blob, got in zip(blobs, batch, strict=True):
        alone = client.post("/v1/classify", files=[("image", ("x", blob))]).json()["results"][0]
        assert alone["indices"] == got["indices"]
        assert np.allclose(alone["scores"], got["scores"], atol=1e-5)


def test_classify_json_base64_and_top_k_capped(client):
    blob = shape_png(4)
    b64 = base64.b64encode(blob).decode()
    r = client.post("/v1/classify?top_k=50",
                    json={"images": [b64, "data:image/png;base64," + b64]})
    assert r.status_code == 200, r.text
    first, second = r.json()["results"]
    assert first == second and len(first["labels"]) == len(SHAPE_CLASSES)
    assert abs(sum(first["scores"]) - 1.0) < 1e-4


def _detect_direct(reference, blob: bytes):
    model, spec = reference["det"]
    image = load_image(blob)
    x = spec.transform()(image)
    with torch.no_grad():
        out = model(x[None], torch.tensor([list(x.shape[-2:])]))
    return PostProcess()(out, torch.tensor([[image.height, image.width]]))[0]


def test_detect_pixels_boxes_match_postprocess(client, reference):
    image = render_detection(3, 0, 128)[0].resize((200, 150))
    blob = encode(image)
    r = client.post("/v1/models/det/detect?threshold=0&max_detections=5", content=blob,
                    headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert (result["width"], result["height"]) == (200, 150)
    ref = _detect_direct(reference, blob)
    order = ref["scores"].argsort(descending=True)[:5]
    dets = result["detections"]
    assert len(dets) == 5
    assert np.allclose([d["score"] for d in dets], ref["scores"][order], atol=1e-5)
    assert np.allclose([d["box"] for d in dets], ref["boxes"][order], atol=1e-3)
    assert [d["label"] for d in dets] == [SHAPE_CLASSES[i] for i in ref["labels"][order]]
    coco = client.post("/v1/detect?threshold=0&max_detections=5&box_format=coco",
                       content=blob, headers={"content-type": "image/png"}).json()
    for d, c in zip(dets, coco["results"][0]["detections"], strict=True):
        x0, y0, x1, y1 = d["box"]
        assert np.allclose(c["box"], [x0, y0, x1 - x0, y1 - y0], atol=1e-3)


def test_detect_batch_with_different_sizes_equals_single(client):
    blobs = [encode(render_detection(3, i, 128)[0].resize(s)) for i, s in
             enumerate([(128, 128), (96, 160), (160, 100)])]
    files = [("file", (f"{i}.png", b)) for i, b in enumerate(blobs)]
    batch = client.post("/v1/detect?threshold=0", files=files).json()["results"]
    for blob, got in zip(blobs, batch, strict=True):
        alone = client.post("/v1/detect?threshold=0", content=blob,
                            headers={"content-type": "image/png"}).json()["results"][0]
        assert np.allclose([d["score"] for d in alone["detections"]],
                           [d["score"] for d in got["detections"]], atol=1e-5)
    high = client.post("/v1/detect?threshold=0.99", content=blobs[0],
                       headers={"content-type": "image/png"}).json()
    assert high["results"][0]["detections"] == []  # untrained: no confident box


def test_model_listing(client):
    models = {m["name"]: m for m in client.get("/v1/models").json()}
    assert models["cls"]["task"] == "classification" and models["det"]["task"] == "detection"
    assert models["cls"]["state"] == "ready" and models["cls"]["num_classes"] == 8
    detail = client.get("/v1/models/det").json()
    assert detail["labels"] == list(SHAPE_CLASSES)
    assert detail["preprocess"]["min_size"] == 128


# ---------------------------------------------------------------- Open Inference Protocol v2

def test_v2_health_and_metadata(client):
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").status_code == 200
    meta = client.get("/v2").json()
    assert meta["name"] == "irpe-serve" and "binary_tensor_data" in meta["extensions"]
    cls = client.get("/v2/models/cls").json()
    assert cls["inputs"] == [{"name": "images", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]
    assert cls["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 8]}]
    det = client.get("/v2/models/det/versions/1").json()
    assert [t["name"] for t in det["inputs"]] == ["images", "sizes"]
    assert det["outputs"][1]["shape"] == [-1, 16, 4]
    assert client.get("/v2/models/det/ready").json() == {"name": "det", "ready": True}


def _images(n: int, size: int = 64) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 3, size, size)).astype(np.float32)


def test_v2_json_infer_equals_direct(client, reference):
    images = _images(2)
    body = {"id": "abc", "inputs": [{"name": "images", "shape": [2, 3, 64, 64],
                                     "datatype": "FP32", "data": images.tolist()}]}
    r = client.post("/v2/models/cls/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "abc" and out["model_name"] == "cls"
    logits = np.asarray(out["outputs"][0]["data"], np.float32).reshape(out["outputs"][0]["shape"])
    with torch.no_grad():
        expected = reference["cls"][0](torch.from_numpy(images)).numpy()
    assert np.allclose(logits, expected, atol=1e-5)


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_classification(url, reference, binary):
    import tritonclient.http as tc
    client = tc.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cls")
    assert client.get_model_metadata("cls")["platform"] == "pytorch_libtorch"
    images = _images(3)
    inp = tc.InferInput("images", list(images.shape), "FP32")
    inp.set_data_from_numpy(images, binary_data=binary)
    outputs = [tc.InferRequestedOutput("logits", binary_data=binary),
               tc.InferRequestedOutput("logits", binary_data=binary, class_count=2)]
    result = client.infer("cls", [inp], outputs=outputs[:1], request_compression_algorithm="gzip")
    with torch.no_grad():
        expected = reference["cls"][0](torch.from_numpy(images)).numpy()
    assert np.allclose(result.as_numpy("logits"), expected, atol=1e-5)
    top = client.infer("cls", [inp], outputs=outputs[1:]).as_numpy("logits")
    assert top.shape == (3, 2)
    for row, logits in zip(top, expected, strict=True):
        text = row[0].decode() if isinstance(row[0], bytes) else row[0]
        score, index, label = text.split(":")
        best = int(logits.argmax())
        assert int(index) == best and label == SHAPE_CLASSES[best]
        assert abs(float(score) - logits[best]) < 1e-5  # the raw logit, Triton's convention
    client.close()


def test_tritonclient_detection_binary_with_sizes(url, reference):
    import tritonclient.http as tc
    client = tc.InferenceServerClient(url.removeprefix("http://"))
    images = np.zeros((2, 3, 96, 128), np.float32)
    images[:, :, :80, :100] = np.random.default_rng(1).standard_normal((2, 3, 80, 100))
    sizes = np.array([[80, 100], [96, 128]], np.int64)
    inputs = [tc.InferInput("images", list(images.shape), "FP32"),
              tc.InferInput("sizes", [2, 2], "INT64")]
    inputs[0].set_data_from_numpy(images)
    inputs[1].set_data_from_numpy(sizes)
    result = client.infer("det", inputs)  # no outputs named: all, binary
    with torch.no_grad():
        ref = reference["det"][0](torch.from_numpy(images), torch.from_numpy(sizes))
    assert np.allclose(result.as_numpy("pred_boxes"), ref["pred_boxes"].numpy(), atol=1e-5)
    assert np.allclose(result.as_numpy("pred_logits"), ref["pred_logits"].numpy(), atol=1e-4)
    whole = client.infer("det", inputs[:1]).as_numpy("pred_boxes")  # no sizes: unpadded
    with torch.no_grad():
        expected = reference["det"][0](torch.from_numpy(images))["pred_boxes"].numpy()
    assert np.allclose(whole, expected, atol=1e-5)
    client.close()


def test_tritonclient_errors_are_readable(url):
    import tritonclient.http as tc
    from tritonclient.utils import InferenceServerException
    client = tc.InferenceServerClient(url.removeprefix("http://"))
    inp = tc.InferInput("images", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InferenceServerException, match=r"images must be \[batch, 3, 64, 64\]"):
        client.infer("cls", [inp])
    assert not client.is_model_ready("nope")
    client.close()


# ---------------------------------------------------------------- batching, overload, faults

def _count(metrics_text: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_concurrent_requests_are_batched(client, url):
    blob = shape_png(5)
    before = client.get("/metrics").text

    def one(_):
        return httpx.post(f"{url}/v1/models/cls/classify", content=blob, timeout=30,
                          headers={"content-type": "image/png"}).status_code

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(16))) == {200}
    after = client.get("/metrics").text
    images = _count(after, "irpe_batch_size_sum", model="cls") - \
        _count(before, "irpe_batch_size_sum", model="cls")
    calls = _count(after, "irpe_batch_size_count", model="cls") - \
        _count(before, "irpe_batch_size_count", model="cls")
    singles = _count(after, "irpe_batch_size_bucket", model="cls", le="1.0") - \
        _count(before, "irpe_batch_size_bucket", model="cls", le="1.0")
    assert images == 16 and calls < 16 and singles < calls  # some batch held > 1 image
    assert _count(after, "irpe_http_requests_total", route="/v1/models/{name}/classify",
                  status="200") >= 16


def test_overload_gives_503_with_retry_after_then_recovers(url, client, gates):
    blob = shape_png(6)

    def one(_):
        r = httpx.post(f"{url}/v1/models/tiny/classify", content=blob, timeout=30,
                       headers={"content-type": "image/png"})
        return r.status_code, r.headers.get("retry-after"), r.json()

    def batches() -> float:  # batches of tiny taken from its queue so far
        return _count(client.get("/metrics").text, "irpe_queue_seconds_count", model="tiny")

    gates["tiny"].clear()  # batches of tiny (1 image, queue of 2) wait until it opens
    try:
        with ThreadPoolExecutor(10) as pool:
            taken = batches()
            first = pool.submit(one, 0)
            wait_until(lambda: batches() > taken, 30, "tiny's first batch is held")
            rest = [pool.submit(one, i) for i in range(1, 10)]
            wait_until(lambda: sum(f.done() for f in rest) == 7, 30, "7 requests refused")
            gates["tiny"].set()
            results = [first.result()] + [f.result() for f in rest]
    finally:
        gates["tiny"].set()
    codes = [c for c, _, _ in results]
    assert sorted(codes) == [200] * 3 + [503] * 7  # computing 1 + queued 2; the rest refused
    for code, retry, body in results:
        if code == 503:
            assert retry == "1" and "queue of model tiny is full" in body["error"]
    assert client.post("/v1/models/tiny/classify", content=blob,
                       headers={"content-type": "image/png"}).status_code == 200


def test_timeout_gives_504_and_failure_500(client):
    blob = shape_png(1)
    r = client.post("/v1/models/slow/classify", content=blob,
                    headers={"content-type": "image/png"})
    assert r.status_code == 504
    assert r.json() == {"error": "model slow did not answer within 0.2 s"}
    r = client.post("/v1/models/broken/classify", content=blob,
                    headers={"content-type": "image/png"})
    assert r.status_code == 500 and r.json()["error"].startswith("inference failed: InjectedFault")
    assert client.post("/v1/models/cls/classify", content=blob,
                       headers={"content-type": "image/png"}).status_code == 200
