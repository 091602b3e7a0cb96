"""The OpenAPI document says what the server does: schemathesis with every check against a real
server, without and with a bearer token, plus the document details it found wrong once."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serve.config import ServeSettings
from tests.helpers import running_server

TOKEN = "openapi-token-7f3a"
CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = 6  # per operation and phase


@pytest.fixture(scope="module", params=[None, TOKEN], ids=["no-token", "token"])
def server(request, files):
    settings = ServeSettings(threads=1, max_images=4, log_level="error",
                             auth_token=request.param, models=[
                                 {"name": "cls", "path": files["cls"]},
                                 {"name": "det", "path": files["det"]}])
    with running_server(settings) as base:
        yield base, request.param


def st_run(url: str, token, cwd) -> subprocess.CompletedProcess:
    """`st run URL/openapi.json --checks all` with the repository's schemathesis settings
    (its state folder .schemathesis/ goes to ``cwd``)."""
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run",
           f"{url}/openapi.json", "--checks", "all", "-n", str(EXAMPLES),
           "--generation-deterministic", "--no-color"]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=cwd)


def test_schemathesis_all_checks_zero_failures(server, tmp_path):
    pytest.importorskip("schemathesis")
    url, token = server
    done = st_run(url, token, tmp_path)
    summary = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert done.returncode == 0 and summary, done.stdout[-6000:] + done.stderr[-2000:]
    generated, passed = map(int, summary.groups())
    print(f"schemathesis --checks all ({'token' if token else 'no token'}): "
          f"{generated} generated, {passed} passed")
    assert generated >= 14 * EXAMPLES and "Tested: 14" in done.stdout


def test_security_declared_only_with_a_token_and_then_enforced(server):
    url, token = server
    spec = httpx.get(f"{url}/openapi.json").json()
    classify = spec["paths"]["/v1/models/{name}/classify"]["post"]
    schemes = spec["components"].get("securitySchemes", {})
    png = {"content-type": "image/png"}
    answer = httpx.post(f"{url}/v1/models/cls/classify", content=b"x", headers=png)
    if token:
        assert classify["security"] == [{"HTTPBearer": []}] and "HTTPBearer" in schemes
        assert "401" in classify["responses"] and answer.status_code == 401
    else:
        assert "security" not in classify and not schemes
        assert "401" not in classify["responses"] and answer.status_code == 400  # not an image
    assert "security" not in spec["paths"]["/v2/health/ready"]["get"]


def test_multipart_needs_a_file_and_v2_enums_are_declared(server):
    url, token = server
    spec = httpx.get(f"{url}/openapi.json").json()
    for path in ("/v1/classify", "/v1/detect", "/v1/models/{name}/classify",
                 "/v1/models/{name}/detect"):
        form = spec["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]
        assert form["schema"]["required"] == ["file"]
        assert form["schema"]["properties"]["file"]["minItems"] == 1
    tensor = spec["components"]["schemas"]["TensorIn"]["properties"]
    assert "FP32" in tensor["datatype"]["enum"] and "" not in tensor["datatype"]["enum"]
    assert tensor["name"]["enum"] == ["images", "sizes"]
    assert tensor["shape"]["items"] == {"type": "integer", "minimum": 0}
    auth = {"authorization": f"Bearer {token}"} if token else {}
    empty = httpx.post(f"{url}/v1/classify", files={"note": (None, "no file")}, headers=auth)
    assert empty.status_code == 400 and empty.json() == {"error": "multipart body has no file part"}
    bad = httpx.post(f"{url}/v2/models/cls/infer", headers=auth, json={"inputs": [
        {"name": "images", "shape": [1], "datatype": "", "data": [0]}]})
    assert bad.status_code == 400 and "unsupported datatype ''" in bad.json()["error"]
