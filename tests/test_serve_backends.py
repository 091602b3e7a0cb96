"""The backend hook: ``serve.backends.register_backend`` adds names that configs may use; the
built-in names stay built in; an unknown name is a one-line settings error."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from irpe.cli import main
from serve.backends import backend_names, create_backend, register_backend
from serve.config import ModelConfig
from tests.helpers import FaultBackend, fault_backend


def test_builtin_backends_cannot_be_replaced():
    for name in ("torch", "onnxruntime", "tensorrt", "openvino"):
        with pytest.raises(ValueError, match=f"backend '{name}' is built in"):
            register_backend(name, FaultBackend)
    assert backend_names()[:4] == ("torch", "onnxruntime", "tensorrt", "openvino")


def test_registered_backend_is_selected_by_name(cls_file):
    name = fault_backend(delay_s=0.0)
    assert name in backend_names()
    backend = create_backend(ModelConfig(name="m", path=cls_file, backend=name))
    assert isinstance(backend, FaultBackend) and backend.spec.task == "classification"


def test_unknown_backend_names_the_available_ones(tmp_path, capsys):
    with pytest.raises(ValidationError, match="should be one of torch, onnxruntime, tensorrt, "
                       "openvino"):
        ModelConfig(name="m", path="x", backend="fault")  # no test backend in the product
    repo = tmp_path / "r.yaml"
    repo.write_text("models: [{name: m, path: x.onnx, backend: tflite}]\n")
    assert main(["serve", str(repo)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("irpe serve: error: invalid settings: models.0.backend: should be one "
                          "of torch, onnxruntime, tensorrt, openvino") and \
        err.endswith("got 'tflite'")
