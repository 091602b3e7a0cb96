"""Non-finite v2 inputs (ServeSettings.v2_nonfinite), against real servers and tritonclient.

Triton's perf_analyzer fills FP32 inputs with random bytes by default (``--input-data random``),
so its requests hold NaN and infinity; Triton computes them. The default ``accept`` does the
same, and a NaN image reaches only its own outputs, never another image of the batch;
``reject`` keeps the strict 400. The perf_analyzer-like load below is its default input made
with tritonclient: random FP32 bytes (with NaN, +inf and -inf in every request), batch 4,
binary and JSON tensors, 4 requests in flight or one every 10 ms (its concurrency and request-rate
modes), on onnxruntime, openvino and torch models.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from pydantic import ValidationError

from serve.config import ServeSettings
from tests.helpers import running_server
from tests.openvino_common import HAVE_OPENVINO

OPENVINO = HAVE_OPENVINO or os.environ.get("CI") == "true"  # CI: never skipped

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def demo_onnx():
    """The demo classifier's ONNX file (exported once into the irpe cache)."""
    from serve.demo import demo_models
    return str(demo_models("onnxruntime")[0].path)


def _settings(models, **extra) -> ServeSettings:
    return ServeSettings(threads=1, log_level="warning", models=models, **extra)


@pytest.fixture(scope="module")
def servers(files, demo_onnx):
    """Two real servers: the default (accept) with onnxruntime, openvino and torch models, and
    one with v2_nonfinite: reject."""
    models = [{"name": "cls", "path": demo_onnx, "backend": "onnxruntime"},
              {"name": "det", "path": files["det"]}]
    if OPENVINO:
        models.append({"name": "cls_ov", "path": demo_onnx, "backend": "openvino"})
    with running_server(_settings(models)) as accept, \
            running_server(_settings(models[:1], v2_nonfinite="reject")) as reject:
        yield {"accept": accept, "reject": reject}


def random_fp32(rng: np.random.Generator, shape) -> np.ndarray:
    """perf_analyzer's default input: random bytes read as FP32 (NaN and inf among them; one of
    each forced, so every request holds them)."""
    array = np.frombuffer(rng.bytes(4 * int(np.prod(shape))), np.float32).reshape(shape).copy()
    array.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    return array


def _client(url: str, concurrency: int = 1):
    import tritonclient.http as tc
    return tc.InferenceServerClient(url.removeprefix("http://"), concurrency=concurrency)


def _infer(client, model: str, images: np.ndarray, binary: bool):
    import tritonclient.http as tc
    inp = tc.InferInput("images", list(images.shape), "FP32")
    inp.set_data_from_numpy(images, binary_data=binary)
    return client.infer(model, [inp], outputs=[tc.InferRequestedOutput("logits",
                                                                        binary_data=binary)])


@pytest.mark.parametrize("mode", ["concurrency", "request-rate"])
@pytest.mark.parametrize("model", ["cls", "cls_ov"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_perf_analyzer_default_random_input_gets_no_error(servers, model, binary, mode):
    """--concurrency-range 4: 4 requests in flight (the client's pool); --request-rate-range
    100: one request every 10 ms, sent without waiting for answers (up to 16 in flight)."""
    import tritonclient.http as tc
    if model == "cls_ov" and not OPENVINO:
        pytest.skip("openvino is not installed (pip install 'irpe-deploy[openvino]')")
    client = _client(servers["accept"], concurrency=4 if mode == "concurrency" else 16)
    rng = np.random.default_rng(7)
    requests = []
    for _ in range(24):
        if mode == "request-rate":
            time.sleep(0.01)
        images = random_fp32(rng, (4, 3, 64, 64))
        inp = tc.InferInput("images", list(images.shape), "FP32")
        inp.set_data_from_numpy(images, binary_data=binary)
        requests.append(client.async_infer(model, [inp], outputs=[
            tc.InferRequestedOutput("logits", binary_data=binary)]))
    logits = [r.get_result().as_numpy("logits") for r in requests]  # raises on any error
    assert all(out.shape == (4, 8) and out.dtype == np.float32 for out in logits)
    client.close()


@pytest.mark.parametrize("model", ["cls", "cls_ov", "det"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_nonfinite_image_reaches_only_its_own_outputs(servers, model, binary):
    if model == "cls_ov" and not OPENVINO:
        pytest.skip("openvino is not installed (pip install 'irpe-deploy[openvino]')")
    import tritonclient.http as tc
    rng = np.random.default_rng(3)
    side = 64 if model.startswith("cls") else 96
    clean, other = rng.standard_normal((2, 3, side, side), dtype=np.float32)
    poisoned = random_fp32(rng, (3, side, side))
    client = _client(servers["accept"])
    name = "logits" if model.startswith("cls") else "pred_logits"

    def run(batch: np.ndarray) -> np.ndarray:
        inp = tc.InferInput("images", list(batch.shape), "FP32")
        inp.set_data_from_numpy(batch, binary_data=binary)
        return client.infer(model, [inp], outputs=[tc.InferRequestedOutput(
            name, binary_data=binary)]).as_numpy(name)
    with_nan, without = run(np.stack([poisoned, clean])), run(np.stack([other, clean]))
    assert np.isfinite(with_nan[1]).all() and np.isfinite(without[1]).all()
    np.testing.assert_allclose(with_nan[1], without[1], rtol=1e-4, atol=1e-4)
    assert not np.isfinite(with_nan[0]).all()  # computed as given: NaN reaches its outputs
    client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_reject_answers_400_and_keeps_serving(servers, binary, value):
    from tritonclient.utils import InferenceServerException
    client = _client(servers["reject"])
    images = np.zeros((2, 3, 64, 64), np.float32)
    images[1, 2, 5, 7] = value
    with pytest.raises(InferenceServerException, match="images contain NaN or infinity"):
        _infer(client, "cls", images, binary)
    images[1, 2, 5, 7] = 0.0
    assert _infer(client, "cls", images, binary).as_numpy("logits").shape == (2, 8)
    client.close()


def test_reject_is_a_typed_setting(monkeypatch):
    assert ServeSettings().v2_nonfinite == "accept"
    monkeypatch.setenv("IRPE_SERVE_V2_NONFINITE", "reject")
    assert ServeSettings().v2_nonfinite == "reject"
    with pytest.raises(ValidationError, match="v2_nonfinite"):
        ServeSettings(v2_nonfinite="replace")
