import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def cls_file(tmp_path_factory):
    """An untrained demo classifier saved as a trained-model file (serving tests, per module)."""
    from tests.test_serve import save_untrained
    return save_untrained("deit_shapes_irpe", tmp_path_factory.mktemp("cls") / "c.safetensors")
