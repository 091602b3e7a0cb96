"""A quantised file (``irpe quantize``) is served like any ONNX file: /v1/models lists its
precision from the file's metadata, it classifies as the fp32 file does, and ``irpe
triton-repo`` packs it into a repository whose model runs at the config's shapes."""
from __future__ import annotations

import logging
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export.onnx import export_onnx
from export.quantize import QuantizeSettings, quantize
from irpe.cli import main
from serve.config import ServeSettings
from tests.helpers import running_server, shape_png

DEMO = Path(__file__).resolve().parents[1] / "irpe" / "demo" / "deit_shapes_irpe.safetensors"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qserve")
    fp32 = export_onnx(str(DEMO), d / "deit.onnx")
    int8 = d / "deit.int8.onnx"
    quantize(fp32, int8, QuantizeSettings(samples=16))
    return {"fp32": fp32, "int8": int8}


class _Records(logging.Handler):
    """The log records of the server's start (the "model ready" lines)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


READY_LOG = _Records()


@pytest.fixture(scope="module")
def client(files):
    models = [{"name": "fp32", "path": str(files["fp32"]), "backend": "onnxruntime"},
              {"name": "int8", "path": str(files["int8"]), "backend": "onnxruntime"}]
    settings = ServeSettings(threads=1, log_level="warning", models=models)
    logger = logging.getLogger("irpe.serve")
    level, logger.level = logger.level, logging.INFO
    logger.addHandler(READY_LOG)
    try:
        with running_server(settings) as base, httpx.Client(base_url=base, timeout=30) as c:
            yield c
    finally:
        logger.removeHandler(READY_LOG)
        logger.setLevel(level)


def test_models_listing_shows_the_files_precision(client):
    listed = {m["name"]: m for m in client.get("/v1/models").json()}
    assert listed["int8"]["precision"] == "int8" and listed["fp32"]["precision"] == "fp32"
    assert listed["int8"]["state"] == "ready" and listed["int8"]["backend"] == "onnxruntime"


def test_file_precision_is_read_with_the_spec(files):
    """The backend's file_precision comes with its spec (serve.backends.Artifact), also through
    a backend that wraps another (the tests' fault backend), not probed as an attribute."""
    from serve.backends import create_backend
    from serve.config import ModelConfig
    from serve.metrics import Metrics
    from serve.model import ServedModel
    from tests.helpers import fault_backend
    int8 = ModelConfig(name="q", path=str(files["int8"]), backend="onnxruntime")
    assert create_backend(int8).file_precision == "int8"
    wrapped = int8.model_copy(update={"backend": fault_backend(inner="onnxruntime")})
    assert ServedModel(wrapped, Metrics()).describe()["precision"] == "int8"
    fp32 = ModelConfig(name="f", path=str(DEMO))  # torch: no file precision, the configured one
    assert create_backend(fp32).file_precision is None
    assert ServedModel(fp32.model_copy(update={"precision": "bf16"}),
                       Metrics()).describe()["precision"] == "bf16"


def test_model_ready_log_says_the_listed_precision(client):
    """One source (issue 42, defect 15): the "model ready" line said fp32 for the int8 file."""
    listed = {m["name"]: m["precision"] for m in client.get("/v1/models").json()}
    logged = {r.model: r.precision for r in READY_LOG.records if r.getMessage() == "model ready"}
    assert logged == listed == {"fp32": "fp32", "int8": "int8"}


def test_quantised_model_classifies_like_fp32(client):
    files = [("file", (f"{i}.png", shape_png(i))) for i in range(6)]
    tops = {}
    for name in ("fp32", "int8"):
        reply = client.post(f"/v1/models/{name}/classify?top_k=3", files=files)
        assert reply.status_code == 200, reply.text
        tops[name] = [r["indices"][0] for r in reply.json()["results"]]
    assert sum(a == b for a, b in zip(tops["fp32"], tops["int8"], strict=True)) >= 5


def test_bad_image_is_a_400_and_the_model_keeps_serving(client):
    bad = client.post("/v1/models/int8/classify", files=[("file", ("x.png", b"not an image"))])
    assert bad.status_code == 400 and "error" in bad.json()
    ok = client.post("/v1/models/int8/classify", files=[("file", ("0.png", shape_png(0)))])
    assert ok.status_code == 200


def test_triton_repo_round_trip(files, tmp_path):
    out = tmp_path / "repo"
    assert main(["triton-repo", str(files["int8"]), "-o", str(out), "--name", "q",
                 "--ort-ops", "none"]) == 0
    model = out / "q" / "1" / "model.onnx"
    packed = onnx.load(model)
    assert {p.key: p.value for p in packed.metadata_props}["irpe.precision"] == "int8"
    assert any(n.op_type == "QuantizeLinear" for n in packed.graph.node)
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64), dtype=np.float32)
    got = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"images": x})[0]
    want = ort.InferenceSession(str(files["int8"]), providers=["CPUExecutionProvider"]).run(
        None, {"images": x})[0]
    np.testing.assert_array_equal(got, want)
    assert "max_batch_size" in (out / "q" / "config.pbtxt").read_text()
