"""Triton's ``perf_analyzer`` on a machine whose glibc is older than its wheel's (2.38).

``python -m tools.perf_analyzer prepare`` (an explicit command: it downloads, from Debian's and
PyPI's registries) makes a runtime in ``~/.cache/irpe/perf-analyzer/`` (``$IRPE_PERF_ANALYZER``
overrides): a Debian 13 (trixie) minimal root made by ``debootstrap`` (root needed) with
libssl3 and libstdc++ of GCC 14, and the ``perf_analyzer`` binary from PyPI's ``perf-analyzer``
wheel. Nothing is installed on the machine itself: the binary runs through trixie's dynamic
loader with trixie's libraries (``ld-linux-x86-64.so.2 --library-path``), in this machine's
network namespace, so it reaches ``irpe serve`` on loopback. ``python -m tools.perf_analyzer
run ARGS`` (or :func:`command`) runs it. Where glibc is >= 2.38 already, ``pip install
perf-analyzer`` is all it takes (docs/serve.md).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ["VERSION", "home", "command", "prepare", "main"]

VERSION = "2.60.0"  # perf-analyzer on PyPI (manylinux_2_38)
SUITE = "trixie"
LIBS = ("libssl3t64", "zlib1g", "libstdc++6")


def home() -> Path:
    """Where the runtime lives."""
    return Path(os.environ.get("IRPE_PERF_ANALYZER")
                or Path.home() / ".cache" / "irpe" / "perf-analyzer")


def command(root: Optional[Path] = None) -> Optional[List[str]]:
    """The argv prefix that runs perf_analyzer, or None when it is not prepared."""
    root = root or home()
    loader, binary = root / SUITE / "lib64" / "ld-linux-x86-64.so.2", root / "perf_analyzer"
    if not (loader.exists() and binary.exists()):
        return None
    return [str(loader), "--library-path", str(root / SUITE / "usr" / "lib" / "x86_64-linux-gnu"),
            str(binary)]


def prepare(root: Optional[Path] = None) -> Path:
    """Make the runtime (module docstring); a finished one is kept. Returns its folder."""
    root = root or home()
    if command(root) is not None:
        return root
    if shutil.which("debootstrap") is None:
        raise SystemExit("perf_analyzer: needs debootstrap (apt-get install debootstrap) and root")
    root.mkdir(parents=True, exist_ok=True)
    system = root / SUITE
    if not (system / "usr" / "bin" / "apt-get").exists():
        shutil.rmtree(system, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", SUITE, str(system),
                        "http://deb.debian.org/debian"], check=True, stdout=subprocess.DEVNULL)
    shutil.copy("/etc/resolv.conf", system / "etc" / "resolv.conf")
    subprocess.run(["chroot", str(system), "sh", "-c", "apt-get update -qq && "
                    f"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {' '.join(LIBS)}"],
                   check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--platform", "manylinux_2_38_x86_64",
                        f"perf-analyzer=={VERSION}", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("perf_analyzer-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read("perf_analyzer/bin/perf_analyzer")
    partial = root / "perf_analyzer.partial"
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(root / "perf_analyzer")  # last: command() sees a finished runtime only
    return root


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["prepare"]:
        print(f"perf_analyzer {VERSION} ready in {prepare()}")
        return 0
    if args[:1] == ["run"]:
        prefix = command()
        if prefix is None:
            print("perf_analyzer: not prepared (python -m tools.perf_analyzer prepare)",
                  file=sys.stderr)
            return 2
        return subprocess.run(prefix + args[1:]).returncode
    print("usage: python -m tools.perf_analyzer prepare | run PERF_ANALYZER_ARGS...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
