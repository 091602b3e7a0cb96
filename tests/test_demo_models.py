"""The bundled demo models load offline, describe themselves, and do their job."""
import pytest
import torch
from torch.utils.data import DataLoader

from irpe.artifact.trained import default_spec, load_trained
from irpe.data.datasets import ShapesClassification, ShapesDetection
from irpe.data.shapes import SHAPE_CLASSES
from irpe.models import create_model, model_info
from irpe.models.registry import bundled_weights
from irpe.training.evaluate import evaluate_classification, evaluate_detection

DEMOS = ["deit_shapes_irpe", "detr_shapes_irpe"]


@pytest.mark.parametrize("name", DEMOS)
def test_bundled_file_is_a_self_describing_trained_model(name):
    model, spec = load_trained(bundled_weights(model_info(name)))
    assert spec.model_name == name and spec.class_names == list(SHAPE_CLASSES)
    assert spec.preprocess == default_spec(name).preprocess
    same = create_model(name, pretrained=True).eval()
    for (k, a), (_, b) in zip(model.state_dict().items(), same.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_demo_classifier_top1_on_held_out_images():
    torch.set_num_threads(1)
    model, spec = load_trained(bundled_weights(model_info("deit_shapes_irpe")))
    # seed 7 was never used in training (seed 0); 200 images, so the bar is below the 95% target
    data = ShapesClassification(200, seed=7, size=64, transform=spec.transform(), split="val")
    metrics = evaluate_classification(model, DataLoader(data, batch_size=50))
    assert metrics["top1"] >= 90.0, metrics


def test_demo_detector_ap50_on_held_out_images():
    torch.set_num_threads(1)
    model, spec = load_trained(bundled_weights(model_info("detr_shapes_irpe")))
    data = ShapesDetection(60, seed=7, transform=spec.transform(), split="val")
    metrics = evaluate_detection(model, data, batch_size=20)
    assert metrics["AP50"] >= 0.5, metrics


def test_pretrained_without_bundled_weights_is_a_clear_error():
    with pytest.raises(ValueError, match="no bundled weights"):
        create_model("deit_tiny_patch16_224", pretrained=True)
