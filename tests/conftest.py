import os

import pytest
import torch

# Triton fixes interpreter vs compiler mode when triton.language is first imported, so without a
# GPU turn the CPU interpreter on before anything imports triton (tests/test_fused_attention.py).
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _restore_logging():
    """`irpe serve` run in-process (CLI tests) reconfigures the irpe/uvicorn loggers: handlers
    on that test's captured stderr, its level. Restore them, so servers of later tests keep
    their own settings and never write to a closed capture stream."""
    import logging
    loggers = [logging.getLogger(n) for n in ("irpe", "uvicorn", "uvicorn.error",
                                               "uvicorn.access")]
    saved = {lg.name: (lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers}
    yield
    for name, (handlers, level, propagate, disabled) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled


@pytest.fixture
def interpret(monkeypatch):
    """Triton kernels on the CPU interpreter, the fused path forced (restored afterwards);
    the fused-attention tests (tests/fused_common.py) take it.

    conftest sets TRITON_INTERPRET=1 before triton is imported when there is no GPU; with a GPU
    the process compiles for real (tests/gpu) and Triton cannot switch modes in one process."""
    from irpe.fused import set_fused_attention, set_fused_ids
    if torch.cuda.is_available():
        pytest.skip("GPU machine: the kernels run compiled in tests/gpu, not interpreted")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    set_fused_attention("on")
    yield
    set_fused_attention(None)
    set_fused_ids("table")


@pytest.fixture(scope="module")
def cls_file(tmp_path_factory):
    """An untrained demo classifier saved as a trained-model file (serving tests, per module)."""
    from tests.helpers import save_untrained
    return save_untrained("deit_shapes_irpe", tmp_path_factory.mktemp("cls") / "c.safetensors")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Untrained demo classifier and detector as trained-model files (serving tests)."""
    from tests.helpers import save_untrained
    d = tmp_path_factory.mktemp("serve")
    return {"cls": save_untrained("deit_shapes_irpe", d / "cls.safetensors"),
            "det": save_untrained("detr_shapes_irpe", d / "det.safetensors")}


@pytest.fixture(scope="module")
def gates():
    """Gates of the gated fault models of ``url`` (open; a test closes one to hold batches)."""
    import threading
    gate = threading.Event()
    gate.set()
    return {"tiny": gate}


@pytest.fixture(scope="module")
def url(files, gates):
    """A real server (thread, 127.0.0.1) with cls, det and fault models slow, broken, tiny
    (gated); modules that need another server define their own ``url``."""
    from serve.config import ServeSettings
    from tests.helpers import fault_backend, running_server
    cls = {"path": files["cls"]}
    settings = ServeSettings(threads=1, max_images=4, log_level="warning", models=[
        {**cls, "name": "cls", "max_queue_delay_ms": 30},
        {"name": "det", "path": files["det"]},
        {**cls, "name": "slow", "timeout_s": 0.2, "backend": fault_backend(delay_s=0.6)},
        {**cls, "name": "broken", "backend": fault_backend(fail=True)},
        {**cls, "name": "tiny", "max_batch_size": 1, "max_queue_size": 2,
         "backend": fault_backend(gate=gates["tiny"])}])
    with running_server(settings) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    """An httpx client on the module's ``url`` server."""
    import httpx
    with httpx.Client(base_url=url, timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def ort_library(tmp_path_factory):
    """The CPU ORT custom-op library (plugins/onnxruntime), built once per test session."""
    from tests.helpers import build_ort_library
    return build_ort_library(tmp_path_factory.mktemp("ort_ops"))


@pytest.fixture(scope="session")
def ov_library(tmp_path_factory):
    """The iRPE OpenVINO library (plugins/openvino), built once per test session."""
    from tests.helpers import build_ov_library
    return build_ov_library(tmp_path_factory.mktemp("ov_ops"))


@pytest.fixture
def ort_library_env(request, monkeypatch):
    """Point ``$IRPE_ORT_OPS_LIBRARY`` (read by ``OrtOptions.from_env``, as in
    ``tests.helpers.env_session``) at the freshly built library (mode from the test); modules
    opt in with ``pytestmark = pytest.mark.usefixtures("ort_library_env")``."""
    monkeypatch.delenv("IRPE_ORT_CUSTOM_OPS", raising=False)
    if "ort_library" in request.fixturenames:
        monkeypatch.setenv("IRPE_ORT_OPS_LIBRARY", str(request.getfixturevalue("ort_library")))
