"""Shared test aids: model files, images, a real server in a thread or a process, readiness
polling, and the fault-injection backend (tests/faults.py, re-exported here).

Importing this module needs no serving stack (fastapi, pydantic): tests/gpu imports it on GPU
machines that lack one, and the serve-side names load on first use (module ``__getattr__``)."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from irpe.artifact.contract import DEFAULT_OPSET
from irpe.artifact.trained import ModelSpec, default_spec, save_trained
from irpe.data.shapes import SHAPE_CLASSES, render_classification
from irpe.models import create_model
from irpe.rpe import randomize_tables

if TYPE_CHECKING:
    from serve.config import ServeSettings
    from serve.model import ServedModel

ROOT = Path(__file__).resolve().parents[1]
# on PYTHONPATH, its sitecustomize makes the packages named in $IRPE_TEST_BLOCKED unimportable
BLOCKER = str(ROOT / "tests" / "blocked_imports")
TINY = dict(img_size=40, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
_FAULT_NAMES = ("FaultBackend", "InjectedFault", "fault_backend")


def __getattr__(name: str):
    """The fault-injection names of tests/faults.py, imported (with the serving stack) on use."""
    if name in _FAULT_NAMES:
        from tests import faults
        return getattr(faults, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------ artifacts and images

def run_python(argv: List[str], timeout: float = 600,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``python ARGV`` from the checkout in a process of its own (output captured): for code
    that changes the whole process, such as ONNX Runtime's shared thread pool."""
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def save_untrained(name: str, path) -> str:
    """An untrained registered model written in trained-model format (shape class names)."""
    torch.manual_seed(0)
    save_trained(create_model(name).eval(), str(path), default_spec(name, list(SHAPE_CLASSES)))
    return str(path)


def encode(image, fmt: str = "PNG", **save_options) -> bytes:
    """A PIL image as file bytes (``save_options``: PIL's, e.g. quality=, exif=)."""
    buf = io.BytesIO()
    image.save(buf, fmt, **save_options)
    return buf.getvalue()


def shape_png(index: int, size: int = 64) -> bytes:
    """Shape ``index`` of the synthetic classification set as PNG bytes."""
    return encode(render_classification(7, index, size)[0])


def jpeg_photo(width: int, height: int, quality: int = 90) -> bytes:
    """A photo-like JPEG (smooth gradients + noise; deterministic per size): what nvJPEG and
    PIL decode differently only within rounding."""
    from PIL import Image
    rng = np.random.default_rng(width + height)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(np.sin(x / 37) + np.cos(y / 23)) * 60 + 128, x * 255 / width,
                    y * 255 / height], -1)
    pixels = np.clip(rgb + rng.normal(0, 12, rgb.shape), 0, 255).astype(np.uint8)
    return encode(Image.fromarray(pixels), "JPEG", quality=quality)


def tiny_deit(cfg, **extra):
    """A 2-block DeiT on a 5x5 patch grid with non-zero iRPE tables, and its spec."""
    kw = dict(TINY, rpe_config=cfg, **extra)
    model = create_model("deit_tiny_patch16_224", **kw).eval()
    randomize_tables(model, std=0.5)
    spec = default_spec("deit_tiny_patch16_224", **kw)
    spec.preprocess["size"] = kw["img_size"]
    return model, spec


def export_tiny_qkv(folder: Path) -> Tuple[torch.nn.Module, ModelSpec, Path, Path]:
    """tiny_deit with product/ctx iRPE on q, k and v (cls skipped), saved as ``m.safetensors``
    and exported from that file to ``m.onnx``: (model, spec, onnx path, weights path)."""
    from export.onnx import export_onnx
    from irpe import RPEConfig
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    model, spec = tiny_deit(cfg)
    weights = Path(folder) / "m.safetensors"
    save_trained(model, str(weights), spec)
    return model, spec, export_onnx(str(weights), Path(folder) / "m.onnx"), weights


def serve_batches(cfg, *batches) -> Tuple[ServedModel, list]:
    """Start a ServedModel (one thread), infer each batch (list of arrays), stop: (model,
    outputs per batch; none when the model did not become ready)."""
    import asyncio

    from serve.metrics import Metrics
    from serve.model import ServedModel
    model = ServedModel(cfg, Metrics(), threads=1)

    async def run():
        await model.start()
        try:
            return [await model.infer(b) for b in batches] if model.ready else []
        finally:
            await model.stop()
    return model, asyncio.run(run())



def decoded(model: ServedModel, blobs: List[bytes]) -> list:
    """A request's images as the server decodes them (``ServedModel.decode``: nvJPEG or the
    shared FIFO pool), from synchronous test code: the uint8 inputs ``[(image, original)]``."""
    import asyncio
    return asyncio.run(model.decode(blobs))


def map_images(fn: Callable[[int, bytes], object], blobs: List[bytes]) -> list:
    """``serve.preprocess_pool.map_images_fifo`` from synchronous test code: ``[fn(i, blob)]``
    in order, each a task of the shared decode pool."""
    import asyncio

    from serve.preprocess_pool import map_images_fifo
    return asyncio.run(map_images_fifo(fn, blobs))


# ------------------------------------------------------------------------ servers

def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``check`` every 50 ms until true; TimeoutError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout_s:g} s")
        time.sleep(0.05)


def _ready(url: str) -> bool:
    import httpx
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
    except httpx.TransportError:  # refused / reset: not listening yet is "not yet"
        return False


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    """Poll GET /v2/health/ready until 200, retrying connection errors until the deadline."""
    wait_until(lambda: _ready(url), timeout_s, f"GET {url}/v2/health/ready == 200")


@contextlib.contextmanager
def running_server(settings: ServeSettings, ready: bool = True,
                   timeout_s: float = 60.0) -> Iterator[str]:
    """Serve ``settings`` in a thread on a free port; yields the base URL (listening; ready
    when ``ready``), stops (draining) on exit."""
    import uvicorn

    from serve.app import create_app
    from serve.net import listen_socket
    from serve.server import socket_url
    sock = listen_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_config=None,
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = socket_url(sock)
    try:
        wait_until(lambda: server.started or not thread.is_alive(), timeout_s,
                   "uvicorn server started (listening)")
        if not thread.is_alive():
            raise RuntimeError("server thread exited during startup")
        if ready:
            wait_ready(url, timeout_s)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


def serve_command(repo, faults: Optional[Dict[str, Dict]] = None) -> List[str]:
    """argv of `irpe serve REPO --port 0`; with ``faults`` ({backend name: FaultBackend
    options}), through tests/fault_serve.py, which registers them first."""
    if faults:
        return [sys.executable, str(ROOT / "tests" / "fault_serve.py"), json.dumps(faults),
                "serve", str(repo), "--port", "0"]
    return [sys.executable, "-m", "irpe", "serve", str(repo), "--port", "0"]


@contextlib.contextmanager
def _sigint_as_from_a_terminal():
    """Children started inside get SIGINT's default action even when this test run ignores it
    (a background CI job): exec resets a handler to the default; an ignored signal stays
    ignored. So the Ctrl-C test sees what `make run` in a terminal sees."""
    import signal  # (signal.signal works in the main thread only; others start as they are)
    ignored = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_cli(repo, env, faults: Optional[Dict[str, Dict]] = None
              ) -> Tuple[subprocess.Popen, str, List[str]]:
    """Start `irpe serve` (JSON logs on stderr); returns (process, URL, lines so far) once the
    "serving" line says it accepts connections."""
    with _sigint_as_from_a_terminal():
        proc = subprocess.Popen(serve_command(repo, faults), stderr=subprocess.PIPE, text=True,
                                env=env, cwd=ROOT)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        entry = json.loads(line)
        if entry["message"] == "serving":
            return proc, entry["url"], lines
    raise AssertionError(f"server exited ({proc.wait()}) before serving: " + "".join(lines))


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    import re

    import httpx
    text = httpx.get(f"{url}/metrics", timeout=30).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{name}{{{want}}} (\S+)$" if labels else rf"^{name} (\S+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_for_log(proc: subprocess.Popen, message: str) -> List[dict]:
    """Read the process's JSON log lines until one has ``message``; the entries read."""
    seen = []
    for line in proc.stderr:
        seen.append(json.loads(line))
        if seen[-1]["message"] == message:
            return seen
    raise AssertionError(f"process exited ({proc.wait()}) without logging {message!r}")


# ------------------------------------------------------------------------ ORT custom-op library

ORT_SOURCE = ROOT / "plugins" / "onnxruntime"
SHARED_ORT_HEADERS = ROOT.parent / "shared" / "third_party" / "onnxruntime-1.23"
ORT_ATTRS = dict(plugin_namespace="irpe", plugin_version="1")


def ort_op_model(op: str, dtype: Optional[int] = None, index: Optional[int] = None,
                 **attrs) -> bytes:
    """One irpe node (x, index) -> out with its local function, as a serialized model
    (dtype / index: onnx TensorProto types, default FLOAT / INT64)."""
    from onnx import TensorProto, helper

    from export.functions import gather_function, scatter_function
    dtype = TensorProto.FLOAT if dtype is None else dtype
    index = TensorProto.INT64 if index is None else index
    node = helper.make_node(op, ["x", "index"], ["out"], domain="irpe", **attrs)
    graph = helper.make_graph([node], "op", [helper.make_tensor_value_info("x", dtype, None),
                                             helper.make_tensor_value_info("index", index, None)],
                              [helper.make_tensor_value_info("out", dtype, None)])
    functions = {"RPEGather": [gather_function(DEFAULT_OPSET)],
                 "RPEScatter": [scatter_function(DEFAULT_OPSET)]}
    model = helper.make_model(graph, functions=functions.get(op, []), opset_imports=[
        helper.make_opsetid("", DEFAULT_OPSET), helper.make_opsetid("irpe", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def ort_headers() -> Optional[Path]:
    """The ORT headers the library build will use, or None."""
    import os
    for root in (os.environ.get("ORT_ROOT"), os.environ.get("ONNXRUNTIME_ROOT"),
                 SHARED_ORT_HEADERS):
        if root and any((Path(root) / s / "onnxruntime_cxx_api.h").is_file()
                        for s in ("include", "include/onnxruntime")):
            return Path(root)
    return None


def build_ort_library(out: Path, *extra: str) -> Path:
    """Build plugins/onnxruntime with CMake into ``out``; skips without headers or cmake,
    except under CI=true, where it fails."""
    import os
    import shutil

    import pytest
    root = ort_headers()
    if root is None or shutil.which("cmake") is None:
        why = ("ONNX Runtime C/C++ headers not found (set ORT_ROOT, or check out ../shared)"
               if root is None else "cmake not found")
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must build the ORT custom-op library: {why}")
        pytest.skip(why)
    build = out / "cmake"
    subprocess.run(["cmake", "-S", str(ORT_SOURCE), "-B", str(build), "-DIRPE_REQUIRE_ORT=ON",
                    f"-DORT_ROOT={root}", f"-DIRPE_ORT_OUTPUT_DIR={out}", *extra],
                   check=True, capture_output=True, text=True)
    done = subprocess.run(["cmake", "--build", str(build), "-j", "2"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stdout.lower() + done.stderr.lower(), done.stdout + done.stderr
    return out / "libirpe_ort_ops.so"


def build_ov_library(out: Path) -> Path:
    """Build plugins/openvino (the iRPE OpenVINO library) with its build.sh into ``out``;
    skips without openvino, cmake or a compiler, except under CI=true, where it fails."""
    import os

    import pytest
    env = dict(os.environ, PYTHON=sys.executable, IRPE_OV_OUTPUT_DIR=str(out))
    script = Path(__file__).resolve().parents[1] / "plugins" / "openvino" / "build.sh"
    done = subprocess.run(["bash", str(script), "--optional", str(out / "cmake")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    if "skipped" in done.stdout:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must build the iRPE OpenVINO library: {done.stdout.strip()}")
        pytest.skip(done.stdout.strip())
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    return out / "libirpe_openvino.so"


def env_session(model, providers=None, **kw):
    """``create_session`` as an entry point runs it: with ``OrtOptions.from_env()`` read at the
    call (the ``ort_library_env`` fixture points ``$IRPE_ORT_OPS_LIBRARY`` at the freshly built
    library); keyword arguments replace those options."""
    from irpe.runtime.onnxruntime.session import OrtOptions, create_session
    return create_session(model, providers, options=OrtOptions.from_env(), **kw)
