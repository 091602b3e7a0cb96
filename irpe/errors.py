"""Exceptions shared by the library and the command line."""
from __future__ import annotations


class CLIError(Exception):
    """A user error: the ``irpe`` command prints it as one line and exits with status 2."""


class GPURequired(CLIError, RuntimeError):
    """A command or runtime needs a CUDA GPU and there is none: one line, exit 2, not a crash.

    Also a RuntimeError so library callers that caught the old error keep working."""
