"""irpe.weights against a real HTTP server on 127.0.0.1 (no mocks): cache, sha256, failures, CLI."""
import hashlib
import json
import re
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import irpe
from irpe import weights
from irpe.checkpoint import CheckpointError
from irpe.cli import main
from irpe.weights import WeightsError

NAME = "deit_tiny_patch16_224_ctx_product_50_shared_k"
FILE = f"{NAME}.pth"
ROOT = Path(__file__).resolve().parents[1]


class _Handler(BaseHTTPRequestHandler):
    """Files under server.root by path; /status/<code>/, /truncated/, /slow/, /redirect*/."""

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        srv = self.server
        with srv.lock:
            srv.hits[self.path] += 1
        kind, _, rest = self.path.lstrip("/").partition("/")
        if kind == "status":
            return self.send_error(int(rest.split("/")[0]))
        if kind == "slow":
            srv.release.wait(10)
        if kind in ("redirect", "redirect-ftp"):
            target = f"/good/{rest}" if kind == "redirect" else f"ftp://127.0.0.1/{rest}"
            self.send_response(302)
            self.send_header("Location", target)
            return self.end_headers()
        file = srv.root / ("good" if kind in ("slow", "truncated") else kind) / rest
        if not file.is_file():
            return self.send_error(404)
        body = file.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) + (4096 if kind == "truncated" else 0)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if kind == "truncated" else body)


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    """good/: the right model's state_dict; wrong/: another model's; junk/: not a checkpoint."""
    root = tmp_path_factory.mktemp("www")
    for sub in ("good", "wrong", "junk"):
        (root / sub).mkdir()
    torch.manual_seed(1)
    torch.save({"model": irpe.create_model(NAME).state_dict()}, root / "good" / FILE)
    torch.save({"model": irpe.create_model("deit_shapes_irpe").state_dict()},
               root / "wrong" / FILE)
    (root / "junk" / FILE).write_bytes(b"<html>not a checkpoint</html>" * 100)
    (root / "good" / "plain.safetensors").write_bytes(b"\x00" * 64)
    return root


@pytest.fixture(scope="module")
def server(payloads):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.root, srv.hits = payloads, Counter()
    srv.lock, srv.release = threading.Lock(), threading.Event()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IRPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("IRPE_WEIGHTS_BASE_URL", raising=False)
    return tmp_path / "cache" / "weights"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files(folder: Path):
    return sorted(p.name for p in folder.glob("*")) if folder.exists() else []


def get(server, sub="good", **kw):
    kw.setdefault("progress", False)
    return weights.fetch(NAME, base_url=f"{server.url}/{sub}", **kw)


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("IRPE_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert weights.weights_dir() == tmp_path / "a" / "weights"
    monkeypatch.delenv("IRPE_CACHE")
    assert weights.cache_dir() == tmp_path / "x" / "irpe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert weights.cache_dir() == tmp_path / "home" / ".cache" / "irpe"


def test_pinned_download_loads_and_second_call_is_cached(server, payloads, cache):
    good = payloads / "good" / FILE
    result = get(server, sha256=digest(good).upper())
    assert result.path == cache / FILE and result.verified and not result.cached
    assert result.sha256 == digest(good) and result.path.read_bytes() == good.read_bytes()
    assert files(cache) == [FILE, FILE + ".json"]
    meta = json.loads((cache / (FILE + ".json")).read_text())
    assert meta["verified"] is True and meta["sha256"] == digest(good) and meta["name"] == NAME
    model = irpe.create_model(NAME, checkpoint=str(result.path))
    served = torch.load(good, weights_only=True)["model"]
    assert torch.equal(model.blocks[3].attn.rpe_k.lookup_table_weight,
                       served["blocks.3.attn.rpe_k.lookup_table_weight"])
    before = sum(server.hits.values())
    again = get(server, sha256=digest(good))
    assert again.cached and again.verified and again.path == result.path
    unpinned = get(server, require_sha256=True)  # verified once: the record stands for the pin
    assert unpinned.cached and unpinned.verified and unpinned.sha256 == digest(good)
    assert sum(server.hits.values()) == before  # served from the cache: no request at all
    assert weights.cached_path(NAME) == result.path and weights.cached_path("nope") is None


def test_sha256_mismatch_deletes_everything(server, cache):
    with pytest.raises(WeightsError, match=r"sha256 mismatch .*expected 0{64}, got [0-9a-f]{64}"):
        get(server, sha256="0" * 64)
    assert files(cache) == []


def test_unverified_download_warns_then_pin_verifies_from_cache(server, payloads, cache, capsys):
    good_sha = digest(payloads / "good" / FILE)
    result = get(server)
    err = capsys.readouterr().err
    assert not result.verified and "unverified" in err and f"pin it with --sha256 {good_sha}" in err
    assert json.loads((cache / (FILE + ".json")).read_text())["verified"] is False
    hits = server.hits[f"/good/{FILE}"]
    pinned = get(server, sha256=good_sha, require_sha256=True)
    assert pinned.cached and pinned.verified and server.hits[f"/good/{FILE}"] == hits
    assert weights.list_cached()[0]["verified"] is True  # the pin is remembered
    assert "unverified" not in capsys.readouterr().err


def test_require_sha256_without_digest_fails_before_any_request(server, cache):
    before = sum(server.hits.values())
    with pytest.raises(ValueError, match="no sha256 known for " + NAME):
        get(server, require_sha256=True)
    assert sum(server.hits.values()) == before and files(cache) == []


def test_corrupted_cache_file_is_fetched_again(server, payloads, cache):
    good_sha = digest(payloads / "good" / FILE)
    get(server)  # unverified: only the sidecar's digest can tell the file changed
    with open(cache / FILE, "r+b") as f:
        f.write(b"XX")
    hits = server.hits[f"/good/{FILE}"]
    result = get(server)
    assert not result.cached and digest(cache / FILE) == good_sha
    assert server.hits[f"/good/{FILE}"] == hits + 1


@pytest.mark.parametrize("sub,match", [
    ("junk", f"/junk/{FILE} is not a usable checkpoint for {NAME}: not a PyTorch checkpoint: "
             "the file starts with b'<html>not a checkpoint"),
    ("wrong", "shape mismatch: .*pos_embed"),
])
def test_unusable_checkpoint_is_removed(server, cache, sub, match):
    with pytest.raises(CheckpointError, match=match):
        get(server, sub)
    assert files(cache) == []


@pytest.mark.parametrize("sub,cause", [
    ("status/404", "HTTP 404"),
    ("status/500", "HTTP 500"),
    ("truncated", r"truncated, got \d+ of \d+ bytes"),
    ("slow", r"timed out after 0.3 s"),
    ("redirect-ftp", r"refused redirect to ftp://127.0.0.1/\S+ \(only http and https\)"),
])
def test_network_failures_leave_nothing(server, cache, sub, cause):
    with pytest.raises(WeightsError, match=f"cannot download {server.url}/{sub}/{FILE}: {cause}"):
        get(server, sub, timeout=0.3)
    assert files(cache) == []  # no .part, no file, no sidecar


def test_refused_connection(cache):
    with socket.socket() as s:  # bound, never listening: refused, and no one else can take it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(WeightsError,
                           match=f"cannot download http://127.0.0.1:{port}/{FILE}: .*refused"):
            weights.download(NAME, base_url=f"http://127.0.0.1:{port}", progress=False,
                             timeout=5)
    assert files(cache) == []


def test_url_argument_redirect_env_mirror_and_progress(server, payloads, cache, tmp_path,
                                                      monkeypatch, capsys):
    # a full URL whose file stem is a registered name gets the same fit check
    path = weights.download(f"{server.url}/redirect/{FILE}", dest_dir=str(tmp_path / "d"),
                            sha256=digest(payloads / "good" / FILE), progress=True)
    assert path == tmp_path / "d" / FILE and files(cache) == []
    assert FILE in capsys.readouterr().err  # tqdm bar named after the file
    monkeypatch.setenv("IRPE_WEIGHTS_BASE_URL", f"{server.url}/good/")
    assert weights.download(NAME, progress=False) == cache / FILE


def test_url_of_unregistered_file_checks_it_reads(server, cache):
    with pytest.raises(CheckpointError, match="not a usable checkpoint for plain"):
        weights.download(f"{server.url}/good/plain.safetensors", progress=False)
    assert files(cache) == []


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(name_or_url="deit_tiny_patch16_224_ctx_product_50_shared"), KeyError,
     "did you mean deit_tiny_patch16_224_ctx_product_50_shared_k"),
    (dict(name_or_url="deit_tiny_patch16_224"), ValueError, "no official checkpoint URL"),
    (dict(name_or_url="file:///etc/passwd"), ValueError, "only http and https.*file"),
    (dict(name_or_url=NAME, base_url="ftp://mirror/x"), ValueError, "only http and https"),
    (dict(name_or_url="http://127.0.0.1:9/"), ValueError, "cannot take a file name"),
    (dict(name_or_url=NAME, sha256="abc"), ValueError, "not a sha256 digest"),
    (dict(name_or_url=NAME, timeout=0), ValueError, "timeout must be > 0"),
])
def test_bad_arguments(cache, kwargs, error, match):
    with pytest.raises(error, match=match):
        weights.download(progress=False, **kwargs)
    assert files(cache) == []


def test_cli_download_list_path(server, payloads, cache, capsys):
    good_sha = digest(payloads / "good" / FILE)
    assert main(["weights", "list"]) == 0
    assert "no weights cached" in capsys.readouterr().out
    args = ["weights", "download", NAME, "--base-url", f"{server.url}/good", "--no-progress",
            "--sha256", good_sha]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [str(cache / FILE), f"sha256 {good_sha} (verified, downloaded, 22.0 MiB)"]
    assert main(args) == 0 and "(verified, cached," in capsys.readouterr().out
    assert main(["weights", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split() == [NAME, "22.0", "MiB", good_sha, "verified"]
    assert main(["weights", "path", NAME]) == 0
    assert capsys.readouterr().out == f"{cache / FILE}\n"


@pytest.mark.parametrize("args,match", [
    (["path", "deit_small_patch16_224_ctx_product_50_shared_k"], "no cached weights for"),
    (["path", "deit_tyni"], "unknown model 'deit_tyni'"),
    (["download", "deit_nope", "--no-progress"], "unknown model 'deit_nope'"),
    (["download", NAME, "--no-progress", "--base-url", "http://127.0.0.1:9"],
     "cannot download http://127.0.0.1:9/"),
    (["download", NAME, "--require-sha256", "--no-progress"], "no sha256 known"),
])
def test_cli_errors_are_one_line(capsys, args, match):
    assert main(["weights"] + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("irpe weights: error: ")
    assert re.search(match, err)


@pytest.mark.parametrize("args", [["download", NAME, "--sha256", "xyz"], ["download"], []])
def test_cli_usage_errors(capsys, args):
    with pytest.raises(SystemExit) as exc:
        main(["weights"] + args)
    assert exc.value.code == 2 and "usage: irpe weights" in capsys.readouterr().err


def test_nothing_downloads_implicitly(server, cache, monkeypatch):
    """create_model never fetches, and no module but irpe/weights.py imports the downloader
    (other names of irpe.weights, such as cache_dir, may be imported)."""
    monkeypatch.setenv("IRPE_WEIGHTS_BASE_URL", f"{server.url}/good")
    before = sum(server.hits.values())
    irpe.create_model(NAME)
    assert sum(server.hits.values()) == before and files(cache) == []
    pattern = re.compile(r"from\s+(irpe|\.+)\.?weights\s+import[^\n]*\b(download|fetch)\b|"
                         r"import\s+irpe\.weights\b|weights\.(download|fetch)\(")
    offenders = [str(p.relative_to(ROOT)) for folder in ("irpe", "export", "serve", "benchmarks")
                 for p in (ROOT / folder).rglob("*.py")
                 if p.name != "weights.py" and pattern.search(p.read_text(errors="replace"))]
    assert offenders == []
