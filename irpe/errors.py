"""Exceptions shared by the library and the command line."""
from __future__ import annotations


class CLIError(Exception):
    """A user error: the ``irpe`` command prints it as one line and exits with status 2."""
