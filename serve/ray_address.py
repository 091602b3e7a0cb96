"""Ray cluster addresses of ``irpe serve --ray``: checked as text when read (a setting, the
flag, ``RAY_ADDRESS``) and probed before Ray is asked to connect, so a typo or a cluster that is
not there is one line, exit 2, within seconds (Ray itself retries a ``ray://`` address for
~30 s and hangs on an invalid port; issue 50, defect 3). Plain code: no ``ray`` import."""
from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Optional, Tuple

from irpe.errors import InvalidInput, ResourceError

__all__ = ["PROBE_TIMEOUT_S", "check_address", "host_port", "probe"]

PROBE_TIMEOUT_S = 5.0  # a TCP connect to the cluster's port; a reachable one answers in ms
_FORM = re.compile(r"^(?:ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
SPECIAL = ("auto", "local")


def check_address(value: Optional[str]) -> Optional[str]:
    """``value`` when it is None, ``auto``, ``local``, ``HOST:PORT`` (a head node's GCS) or
    ``ray://HOST:PORT`` (Ray Client) with a port 1-65535; else a ValueError saying so."""
    if value is None or value in SPECIAL:
        return value
    found = _FORM.match(value)
    if found is None or not 0 < int(found.group(2)) < 65536:
        raise ValueError(f"{value!r} is not a Ray address: auto, HOST:PORT (a head node, port "
                         "1-65535) or ray://HOST:PORT (Ray Client, usually port 10001)")
    return value


RECORD = "ray_current_cluster"  # where `ray start` records its cluster, in Ray's temp folder


def recorded_cluster(source: str) -> str:
    """The address of the cluster ``ray start`` last recorded on this machine (what Ray's
    ``auto`` connects to; its temp folder is $RAY_TMPDIR/ray, else /tmp/ray), or one line
    (exit 2) where none is recorded: Ray itself takes ~30 s to say so."""
    folder = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    try:
        recorded = (folder / RECORD).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    if not recorded:
        raise ResourceError(f"{source} auto: no Ray cluster runs on this machine (none recorded "
                            f"in {folder / RECORD}; start one with ray start --head, or leave "
                            "the address unset for a Ray of this command)")
    return recorded


def host_port(address: str) -> Tuple[str, int]:
    """The host and port of a checked ``HOST:PORT`` / ``ray://HOST:PORT`` address."""
    found = _FORM.match(address)
    if found is None:
        raise InvalidInput(f"{address!r} is not a Ray address")
    return found.group(1).strip("[]"), int(found.group(2))


def probe(address: Optional[str], source: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Check ``address`` (given by ``source``: a flag, a setting, RAY_ADDRESS) as text, then
    that something listens there (``auto``: the cluster ``ray start`` recorded on this machine):
    InvalidInput / ResourceError (one line, exit 2) within ``timeout_s``."""
    try:
        check_address(address)
    except ValueError as exc:
        raise InvalidInput(f"{source}: {exc}") from None
    if address is None or address == "local":
        return
    if address == "auto":
        address, source = recorded_cluster(source), f"{source} auto, {RECORD}"
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ResourceError(f"the Ray cluster at {address} ({source}) cannot be reached: "
                            f"{why} (within {timeout_s:g} s)") from None
