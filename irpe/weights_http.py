"""The HTTP transport of :mod:`irpe.weights`: stream one URL to a file object while hashing it,
following redirects only to http(s), with an optional tqdm bar; failures become WeightsError.

Only irpe.weights calls this (nothing downloads implicitly: see that module)."""
from __future__ import annotations

import hashlib
import http.client
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import IO, TYPE_CHECKING, BinaryIO, NoReturn, Optional, Tuple, Union

from .errors import IrpeError

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["CHUNK", "WeightsError", "stream"]

CHUNK = 1 << 20


class WeightsError(IrpeError, OSError):
    """A download that failed or did not match its digest; names the URL and the cause."""

    __module__ = "irpe.weights"  # raised and documented as irpe.weights.WeightsError


class _HttpOnlyRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects (release assets live behind one) but only to http/https."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: http.client.HTTPMessage,
                         newurl: str) -> Optional[urllib.request.Request]:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise urllib.error.URLError(f"refused redirect to {newurl} (only http and https)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _progress_bar(total: Optional[int], desc: str) -> Optional[tqdm[NoReturn]]:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is an optional extra; download silently without it
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr)


def _copy(resp: http.client.HTTPResponse, out: BinaryIO, progress: bool,
          desc: str) -> Tuple[str, int, Optional[int]]:
    length = resp.headers.get("Content-Length", "").strip()
    total, digest, size = int(length) if length.isdigit() else None, hashlib.sha256(), 0
    bar = _progress_bar(total, desc) if progress else None
    try:
        while chunk := resp.read(CHUNK):
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return digest.hexdigest(), size, total


def stream(url: str, out: BinaryIO, timeout: float, progress: bool, desc: str) -> Tuple[str, int]:
    """Write the body of ``url`` to ``out``; (sha256, size). Network failures -> WeightsError."""
    opener = urllib.request.build_opener(_HttpOnlyRedirect)
    request = urllib.request.Request(url, headers={"User-Agent": "irpe-weights"})
    try:
        with opener.open(request, timeout=timeout) as resp:
            digest, size, total = _copy(resp, out, progress, desc)
    except urllib.error.HTTPError as exc:
        raise WeightsError(f"cannot download {url}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise WeightsError(f"cannot download {url}: {_cause(exc.reason, timeout)}") from exc
    except (http.client.HTTPException, OSError) as exc:
        raise WeightsError(f"cannot download {url}: {_cause(exc, timeout)}") from exc
    if total is not None and size != total:
        raise WeightsError(f"cannot download {url}: truncated, got {size} of {total} bytes")
    return digest, size


def _cause(reason: Union[str, BaseException], timeout: float) -> str:
    if isinstance(reason, TimeoutError):
        return f"timed out after {timeout:g} s"
    return str(reason) or type(reason).__name__
