"""The ``irpe`` console script: its command line module imported inside the Ctrl-C handling.

Importing :mod:`irpe.cli` takes torch (seconds); a Ctrl-C then used to print Python's
traceback. Here it is one line and exit status 130, as everywhere else in ``irpe``
(:func:`irpe.cli.main`). This module imports nothing heavy: the package's names load lazily.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Import the command line, then run it (:func:`irpe.cli.main`)."""
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("irpe: interrupted\n")
        return 130
    return run(argv)
