"""Artifact writers registered with irpe, so a reader (serve's demo) can have a file written
without importing the writer's package.

export/ registers the ``onnx`` exporter when it is imported; :func:`get_exporter` imports the
package that provides a kind (:data:`PROVIDERS`) when nothing registered it yet, the same way
the ``irpe`` command line finds its extension commands.
"""
from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Tuple

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["Exporter", "PROVIDERS", "register_exporter", "get_exporter"]

# artifact kind -> the package that registers its exporter on import
PROVIDERS = {"onnx": "export"}


@dataclass(frozen=True)
class Exporter:
    """``write(source, output)`` makes the artifact; ``sources`` are the folders of code that
    shape its bytes (besides irpe/ itself), for cache keys."""

    kind: str
    write: Callable[[str, Path], Path]
    sources: Tuple[Path, ...]

    def fingerprint(self) -> str:
        """sha256 over irpe's and the exporter's Python sources: a change to either changes it."""
        import irpe
        digest = hashlib.sha256(irpe.__version__.encode())
        for root in (Path(irpe.__file__).parent,) + self.sources:
            for source in sorted(root.rglob("*.py")):
                digest.update(str(source.relative_to(root)).encode() + source.read_bytes())
        return digest.hexdigest()


_EXPORTERS: Dict[str, Exporter] = {}


def register_exporter(kind: str, write: Callable[[str, Path], Path],
                      sources: Tuple[StrPath, ...] = ()) -> None:
    """Make ``kind`` artifacts writable through :func:`get_exporter` (re-registering replaces)."""
    _EXPORTERS[kind] = Exporter(kind, write, tuple(Path(s) for s in sources))


def get_exporter(kind: str) -> Exporter:
    """The registered exporter of ``kind``; RuntimeError naming what to install when absent."""
    if kind not in _EXPORTERS and kind in PROVIDERS:
        try:
            importlib.import_module(PROVIDERS[kind])
        except ImportError as exc:
            raise RuntimeError(f"no {kind} exporter: package {PROVIDERS[kind]!r} cannot be "
                               f"imported ({exc})") from None
    if kind not in _EXPORTERS:
        raise RuntimeError(f"no {kind} exporter is registered (known kinds: "
                           f"{sorted(set(_EXPORTERS) | set(PROVIDERS))})")
    return _EXPORTERS[kind]
