"""No secret in logs: a real `irpe serve` process with a bearer token, at debug level, answering
right, wrong and malformed credentials never writes the token or the Authorization header."""
from __future__ import annotations

import os
import signal

import httpx

from tests.helpers import shape_png, start_cli, wait_ready

TOKEN, WRONG = "tok-9f8e7d6c5b4a", "guess-0a1b2c3d4e"


def test_token_and_authorization_header_never_logged(tmp_path, cls_file):
    repo = tmp_path / "auth.yaml"
    repo.write_text(f"log_level: debug\nmodels:\n  - {{name: cls, path: {cls_file}}}\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "IRPE_SERVE_AUTH_TOKEN": TOKEN}
    proc, url, lines = start_cli(repo, env)
    try:
        wait_ready(url)
        codes = _requests(url)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        proc.kill()
    logs = "".join(lines) + proc.stderr.read()
    assert codes == [200, 401, 401, 401, 200, 400, 404], codes
    assert logs.count('"message": "request"') >= len(codes)  # the requests were logged
    assert TOKEN not in logs and WRONG not in logs
    assert "authorization" not in logs.lower() and "bearer " not in logs.lower()


def _requests(url: str) -> list:
    """Right, wrong, Basic, query-string and error-path requests; their status codes."""
    png, good = {"content-type": "image/png"}, {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=30) as c:
        return [r.status_code for r in (
            c.post("/v1/models/cls/classify", content=shape_png(0), headers={**png, **good}),
            c.post("/v1/models/cls/classify", content=shape_png(0),
                   headers={**png, "authorization": f"Bearer {WRONG}"}),
            c.post("/v1/models/cls/classify", content=shape_png(0), headers=png,
                   auth=("user", TOKEN)),
            c.post(f"/v1/models/cls/classify?token={TOKEN}", content=shape_png(0),
                   headers=png),
            c.get("/v2/models/cls", headers=good),
            c.post("/v2/models/cls/infer", content=b"{not json", headers={
                **good, "content-type": "application/json"}),
            c.post("/v1/models/nope/classify", content=shape_png(0), headers={**png, **good}),
        )]
