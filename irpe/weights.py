"""Explicit download of official iRPE checkpoints into a local cache, checked by sha256.

Nothing in this project downloads implicitly: ``create_model`` never fetches, and no module
other than this one (and its ``irpe weights`` command) calls :func:`download`. Weights arrive
only when a user asks for them.

Cache: ``$IRPE_CACHE``, else ``$XDG_CACHE_HOME/irpe``, else ``~/.cache/irpe``; files live under
``<cache>/weights/`` with a sidecar ``<file>.json`` (name, url, size, sha256, verified). The
sidecar is written last, after every check passed, so it marks a complete, usable download.

sha256 policy: the expected digest is the caller's pin (``sha256=`` / ``--sha256``) or
:data:`KNOWN_SHA256`. A mismatch deletes the download. Without an expected digest the file is
kept but reported as unverified on stderr, with its digest to pin; ``require_sha256`` makes
that an error. The official zoo publishes no digests and this project could not fetch the
files to compute them, so :data:`KNOWN_SHA256` is empty: pin what you have checked yourself.
The HTTP streaming itself lives in :mod:`irpe.weights_http`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import posixpath
import re
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .atomic import atomic_path, write_text
from .errors import InvalidInput
from .weights_http import CHUNK, WeightsError, stream

__all__ = ["KNOWN_SHA256", "WeightsError", "Fetched", "cache_dir", "weights_dir", "download",
           "fetch", "resolve", "cached_path", "list_cached", "file_sha256", "parse_sha256",
           "add_parser"]

# Registered model name -> sha256 of its official checkpoint. Empty: no official digest could be
# established here (the zoo lists none and the files are not reachable from this machine).
KNOWN_SHA256: Dict[str, str] = {}

BASE_URL_ENV = "IRPE_WEIGHTS_BASE_URL"
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Fetched:
    """Outcome of :func:`fetch`: where the file is, its digest, and how it got there."""

    name: str
    url: str
    path: Path
    sha256: str
    size: int
    verified: bool
    cached: bool


def cache_dir() -> Path:
    """Root of the irpe cache: ``$IRPE_CACHE``, ``$XDG_CACHE_HOME/irpe`` or ``~/.cache/irpe``."""
    if os.environ.get("IRPE_CACHE"):
        return Path(os.environ["IRPE_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "irpe"
    return Path.home() / ".cache" / "irpe"


def weights_dir() -> Path:
    """Folder holding downloaded checkpoints and their sidecars."""
    return cache_dir() / "weights"


def parse_sha256(text: str) -> str:
    """Normalise a hex sha256 (64 hex digits, any case); anything else raises InvalidInput (a
    ValueError)."""
    digest = text.strip().lower()
    if not _SHA256.fullmatch(digest):
        raise InvalidInput(f"not a sha256 digest (64 hex digits): {text!r}")
    return digest


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_scheme(url: str) -> None:
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise InvalidInput(f"only http and https URLs are accepted, not {scheme or 'no'} scheme: "
                           f"{url}")


def _file_name(url: str) -> str:
    name = urllib.parse.unquote(posixpath.basename(urllib.parse.urlsplit(url).path))
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise InvalidInput(f"cannot take a file name from URL {url}")
    return name


def _registered(name: str) -> bool:
    from .models import list_models
    return name in list_models()


def resolve(name_or_url: str, base_url: Optional[str] = None) -> Tuple[str, str, bool]:
    """(name, url, registered) for a model name or an http(s) URL, after the mirror rewrite."""
    if "://" in name_or_url:
        _check_scheme(name_or_url)
        url = name_or_url
        name = posixpath.splitext(_file_name(url))[0]
    else:
        from .models import model_info
        info = model_info(name_or_url)  # UnknownName naming close matches
        if not info.url:
            raise InvalidInput(f"{info.name} has no official checkpoint URL (only the iRPE zoo "
                               "models do; see `irpe models`)")
        name, url = info.name, info.url
    base = base_url or os.environ.get(BASE_URL_ENV)
    if base:
        _check_scheme(base)
        url = base.rstrip("/") + "/" + urllib.parse.quote(_file_name(url))
    return name, url, _registered(name)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _read_sidecar(path: Path) -> Optional[Dict]:
    try:
        meta = json.loads(_sidecar(path).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get("sha256"), str) else None


def _write_sidecar(result: Fetched) -> None:
    meta = {"name": result.name, "url": result.url, "file": result.path.name,
            "size": result.size, "sha256": result.sha256, "verified": result.verified}
    write_text(_sidecar(result.path), json.dumps(meta, indent=1) + "\n")


def _from_cache(name: str, url: str, path: Path, expected: Optional[str]) -> Optional[Fetched]:
    """The cached file if it is complete and matches the pin (or its own record without one)."""
    meta = _read_sidecar(path)
    if meta is None or not path.is_file():
        return None
    digest = file_sha256(path)
    if digest != meta["sha256"] or (expected is not None and digest != expected):
        return None  # changed on disk, or not the file the caller pinned: fetch again
    verified = expected is not None or bool(meta.get("verified"))
    result = Fetched(name, url, path, digest, path.stat().st_size, verified, cached=True)
    if verified and not meta.get("verified"):
        _write_sidecar(result)  # now pinned: remember it
    return result


def _sniff(path: Path) -> None:
    """Name what a non-checkpoint looks like (often an HTML error page served with status 200)."""
    if path.suffix == ".safetensors":
        return  # the safetensors reader explains its own format errors
    with open(path, "rb") as f:
        head = f.read(32)
    if not (head.startswith(b"PK\x03\x04") or head.startswith(b"\x80")):  # zip or pickle
        raise ValueError(f"not a PyTorch checkpoint: the file starts with {head!r}")


def _check_checkpoint(path: Path, name: str, registered: bool, url: str) -> None:
    """The file must read as a state_dict and, for a registered name, load strictly into it."""
    from .checkpoint import CheckpointError, read_state_dict
    ok = False
    try:
        _sniff(path)
        if registered:
            from .models import create_model
            create_model(name, checkpoint=str(path))
        else:
            read_state_dict(str(path))
        ok = True
    except Exception as exc:  # whatever went wrong, the file is not a usable checkpoint
        raise CheckpointError(f"{url} is not a usable checkpoint for {name}: {exc}; the "
                              "download was deleted") from exc
    finally:
        if not ok:
            path.unlink(missing_ok=True)


def _download_new(name: str, url: str, path: Path, expected: Optional[str], registered: bool,
                  progress: bool, timeout: float) -> Fetched:
    """Stream to a temporary beside the file, verify, move into place (irpe.atomic), check,
    then record."""
    with atomic_path(path) as part:
        with open(part, "wb") as out:  # an ordinary file (umask), readable like any other
            digest, size = stream(url, out, timeout, progress, path.name)
        if expected is not None and digest != expected:
            raise WeightsError(f"sha256 mismatch for {url}: expected {expected}, got {digest}; "
                               "the download was deleted")
        _sidecar(path).unlink(missing_ok=True)  # an old record must never describe a new file
    _check_checkpoint(path, name, registered, url)
    result = Fetched(name, url, path, digest, size, expected is not None, cached=False)
    _write_sidecar(result)
    return result


def fetch(name_or_url: str, dest_dir: Optional[str] = None, sha256: Optional[str] = None,
          base_url: Optional[str] = None, progress: bool = True, timeout: float = 30,
          require_sha256: bool = False) -> Fetched:
    """Like :func:`download`, returning the digest and whether it was verified or cached."""
    if not timeout > 0:
        raise InvalidInput(f"timeout must be > 0 seconds, got {timeout}")
    name, url, registered = resolve(name_or_url, base_url)
    expected = parse_sha256(sha256) if sha256 is not None else KNOWN_SHA256.get(name)
    path = Path(dest_dir or weights_dir()) / _file_name(url)
    result = _from_cache(name, url, path, expected)
    if require_sha256 and expected is None and not (result and result.verified):
        raise InvalidInput(f"no sha256 known for {name}: pass --sha256 HEX (sha256=) with a digest "
                           "you trust, or drop --require-sha256")
    if result is None:
        result = _download_new(name, url, path, expected, registered, progress, timeout)
    if not result.verified:
        print(f"warning: {result.path.name} is unverified (no sha256 pinned or known), sha256 "
              f"{result.sha256}: pin it with --sha256 {result.sha256}", file=sys.stderr)
    return result


def download(name_or_url: str, dest_dir: Optional[str] = None, sha256: Optional[str] = None,
             base_url: Optional[str] = None, progress: bool = True, timeout: float = 30,
             require_sha256: bool = False) -> Path:
    """Download a registered model's official checkpoint (or an http(s) URL) into the cache.

    Returns the local path; a cached file that matches is used without any network access.
    """
    return fetch(name_or_url, dest_dir, sha256, base_url, progress, timeout,
                 require_sha256).path


def list_cached() -> List[Dict]:
    """Completed downloads in the cache: name, path, size, sha256, verified, url."""
    entries = []
    for side in sorted(weights_dir().glob("*.json")):
        path = side.with_name(side.name[:-len(".json")])
        meta = _read_sidecar(path)
        if meta is None or not path.is_file():
            continue
        entries.append({"name": meta.get("name", path.stem), "path": str(path),
                        "size": path.stat().st_size, "sha256": meta["sha256"],
                        "verified": bool(meta.get("verified")), "url": meta.get("url")})
    return entries


def cached_path(name: str) -> Optional[Path]:
    """Path of the cached checkpoint of ``name`` (a model name or a URL's file stem), or None."""
    for entry in list_cached():
        if entry["name"] == name:
            return Path(entry["path"])
    return None


# ---- command line: irpe weights download | list | path ----

def _sha256_arg(text: str) -> str:
    try:
        return parse_sha256(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_download(args: argparse.Namespace) -> int:
    result = fetch(args.target, dest_dir=args.dest, sha256=args.sha256, base_url=args.base_url,
                   progress=not args.no_progress, timeout=args.timeout,
                   require_sha256=args.require_sha256)
    print(result.path)
    print(f"sha256 {result.sha256} ({'verified' if result.verified else 'unverified'}, "
          f"{'cached' if result.cached else 'downloaded'}, {result.size / 2**20:.1f} MiB)")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    entries = list_cached()
    if not entries:
        print(f"no weights cached in {weights_dir()}")
        return 0
    width = max(len(e["name"]) for e in entries)
    print(f"{'name':<{width}} {'size':>10}  {'sha256':<64}  status")
    for e in entries:
        status = "verified" if e["verified"] else "unverified"
        print(f"{e['name']:<{width}} {e['size'] / 2**20:>6.1f} MiB  {e['sha256']}  {status}")
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    from .errors import CLIError
    path = cached_path(args.name)
    if path is None:
        if "://" not in args.name and not _registered(args.name):
            from .models import model_info
            model_info(args.name)  # KeyError with close matches
        raise CLIError(f"no cached weights for {args.name} in {weights_dir()}; run "
                       f"`irpe weights download {args.name}`")
    print(path)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe weights {download,list,path}`` on the CLI's subparsers."""
    p = sub.add_parser("weights", help="download official checkpoints (sha256-checked cache)")
    actions = p.add_subparsers(dest="weights_command", required=True, metavar="ACTION")
    d = actions.add_parser("download", help="fetch a zoo checkpoint or an http(s) URL")
    d.add_argument("target", metavar="NAME_OR_URL", help="registered model name or http(s) URL")
    d.add_argument("--sha256", type=_sha256_arg, help="expected sha256 (64 hex digits)")
    d.add_argument("--require-sha256", action="store_true",
                   help="fail unless a digest is pinned or known")
    d.add_argument("--dest", help="folder to download into (default: the cache)")
    d.add_argument("--base-url", help=f"mirror replacing the URL up to the file name "
                   f"(env {BASE_URL_ENV})")
    d.add_argument("--timeout", type=float, default=30, help="socket timeout in seconds")
    d.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    d.set_defaults(func=_cmd_download)
    ls = actions.add_parser("list", help="cached checkpoints: name, size, sha256, verified")
    ls.set_defaults(func=_cmd_list)
    pa = actions.add_parser("path", help="print the cached file of a model")
    pa.add_argument("name", help="model name (or the file stem of a downloaded URL)")
    pa.set_defaults(func=_cmd_path)
