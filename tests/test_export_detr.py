"""DETR export: ONE file, correct at several resolutions (non-square, padded batches), bucket
ids computed in the graph; validation of the file as a library call."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.functions import DOMAIN, GATHER
from export.onnx import export_onnx
from export.validate import validate
from irpe import create_model, save_checkpoint
from irpe.artifact.contract import read_onnx_props
from irpe.models import pad_images

NAME = "detr_tiny_irpe"


@pytest.fixture(scope="module")
def detr(tmp_path_factory):
    """detr_tiny_irpe with random weights saved as a checkpoint, exported from that file."""
    d = tmp_path_factory.mktemp("detr")
    torch.manual_seed(3)
    model = create_model(NAME).eval()
    save_checkpoint(model, str(d / "w.safetensors"))
    path = export_onnx(NAME, d / "detr.onnx", checkpoint=str(d / "w.safetensors"))
    return model, path


def _compare(model, session, images, sizes):
    with torch.no_grad():
        ref = model(images, sizes)
    logits, boxes = session.run(None, {"images": images.numpy(), "sizes": sizes.numpy()})
    np.testing.assert_allclose(logits, ref["pred_logits"].numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(boxes, ref["pred_boxes"].numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("height,width", [(96, 160), (160, 96), (128, 128), (75, 201)])
def test_one_file_every_resolution(detr, height, width):
    model, path = detr
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    images = torch.randn(2, 3, height, width)
    full = torch.tensor([[height, width], [height, width]])
    _compare(model, session, images, full)
    padded, sizes = pad_images([torch.randn(3, height, width), torch.randn(3, height // 2, 40)])
    _compare(model, session, padded, sizes)


def test_batch_of_three_with_padding(detr):
    model, path = detr
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    images, sizes = pad_images([torch.randn(3, 64, 100), torch.randn(3, 120, 70),
                                torch.randn(3, 33, 33)])
    _compare(model, session, images, sizes)


def test_graph_io_nodes_and_metadata(detr, tmp_path):
    _, path = detr
    proto = onnx.load(path)
    assert [n.op_type for n in proto.graph.node if n.domain == DOMAIN] == [GATHER, GATHER]
    assert [f.name for f in proto.functions] == [GATHER]
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(proto.graph.input) + list(proto.graph.output)}
    assert shapes == {"images": ["batch", 3, "height", "width"], "sizes": ["batch", 2],
                      "pred_logits": ["batch", 20, 9], "pred_boxes": ["batch", 20, 4]}
    # bucket ids come from the feature-map size inside the graph, not from a constant
    assert {"Log", "Round", "Range"} <= {n.op_type for n in proto.graph.node}
    props = read_onnx_props(path)
    assert props["irpe.task"] == "detection" and props["irpe.weights"].startswith("checkpoint:")


def test_validate_detection_file(detr):
    _, path = detr
    report = validate(path, num_inputs=3, sizes=[(96, 128), (128, 72)])
    assert report["passed"], report
    assert report["outputs"]["pred_boxes"]["max_abs"] < 1e-4
    assert report["metrics"]["label_agreement"] == 1.0
    assert report["metrics"]["box_l1_max"] < 1e-4
    assert "96x128; 128x72" in report["batches"][0]
