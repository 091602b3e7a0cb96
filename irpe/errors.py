"""Exceptions shared by the library and the command line.

:class:`IrpeError` is the base of the errors a user can fix: bad input (an argument, a setting,
the content of a file they named), a missing file, a missing GPU or runtime. The ``irpe``
command prints those as one line and exits with status 2; any other exception is a bug and
shows its traceback (``irpe --debug`` / ``IRPE_DEBUG=1`` show it for these too). The subclasses
that are also a built-in type (ValueError, KeyError, FileNotFoundError, OSError, RuntimeError)
keep library callers that caught the built-in type working."""
from __future__ import annotations

__all__ = ["IrpeError", "CLIError", "InvalidInput", "UnknownName", "MissingFile",
           "ResourceError", "GPURequired"]


class IrpeError(Exception):
    """An error the user can fix: the ``irpe`` command prints it as one line, exit status 2."""


class CLIError(IrpeError):
    """A usage error found by a command itself (arguments that do not go together)."""


class InvalidInput(IrpeError, ValueError):
    """A value the user gave (argument, setting, environment variable) or the content of a file
    they named that cannot be used; the message says which and why."""


class UnknownName(IrpeError, KeyError):
    """A name that is not registered (a model, a dataset split); the message lists the close
    ones. Also a KeyError for the registry's callers; ``str()`` is the message, unquoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MissingFile(IrpeError, FileNotFoundError):
    """A file or folder the user named (or one that must sit beside it, such as an engine's
    sidecar) is not there; the message names it."""


class ResourceError(IrpeError, OSError):
    """The system refused what the user asked for (a port to listen on, a plugin library to
    load); the message names it and the system's reason."""


class GPURequired(CLIError, RuntimeError):
    """A command or runtime needs a CUDA GPU and there is none: one line, exit 2, not a crash.

    Also a RuntimeError so library callers that caught the old error keep working."""
