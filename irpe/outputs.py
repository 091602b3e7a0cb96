"""The write rule in one place: which paths a command may write (docs/DECISIONS.md, "One write
rule").

Every command that writes calls :func:`check_outputs` once, before any work, with every file it
will write and every file it reads. Both sides are expanded with their companions (the files
that are part of the same artifact: an OpenVINO IR's ``.bin`` beside its ``.xml``, a TensorRT
engine's ``.json`` sidecar), because writing an IR writes its ``.bin`` and reading an engine
reads its sidecar. An output is refused, in one line (an :class:`OutputRefused`, which the
``irpe`` command prints and exits 2 on), when one of its files

- is one of the inputs' files: the same path, or the same file through a link (a tool never
  destroys what it reads; ``--json m.int8.bin`` of an IR's reader would replace its weights);
- is an existing folder (the write would fail only after all the work, or replace a folder);
- lies under an existing path that is not a folder (its folder cannot be made).

How a file is written once allowed (complete or not at all) is :mod:`irpe.atomic`'s part.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, List, Optional, Tuple, Union

from .artifact.names import companions
from .errors import InvalidInput

__all__ = ["OutputRefused", "SameFileError", "OutputIsFolder", "same_file",
           "check_outputs"]

PathArg = Union[str, "os.PathLike[str]"]


class OutputRefused(InvalidInput):
    """An output path the write rule refuses; the message names the user's path and why."""


class SameFileError(OutputRefused):
    """The output names one of the inputs' files: writing it would destroy that input."""


class OutputIsFolder(OutputRefused, IsADirectoryError):
    """A file to write names an existing folder (also an IsADirectoryError, as the system's
    error was for library callers)."""


def same_file(a: PathArg, b: PathArg) -> bool:
    """Whether ``a`` and ``b`` are the same path (after normalisation) or the same existing
    file (hard or symbolic links, ``os.path.samefile``)."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): not the same file
        return False


def check_outputs(outputs: Iterable[Optional[PathArg]],
                  inputs: Iterable[Optional[PathArg]] = (),
                  replaced_folders: Iterable[Optional[PathArg]] = ()) -> None:
    """Refuse, before any work, what a command must not write (:class:`OutputRefused`).

    ``outputs``: the files the command writes (companions added); ``inputs``: every file it
    reads (companions added; a folder read, such as a dataset, is an input too: an output
    naming it is refused); ``replaced_folders``: folders it replaces as a whole (a Triton model
    directory), refused where one is an existing file or holds one of the inputs' files. None
    entries are skipped (an option not given)."""
    read = [(source, part) for source in inputs if source is not None
            for part in companions(source)]
    for output in outputs:
        if output is not None:
            for part in companions(output):
                _check_file(output, part, read)
    for folder in replaced_folders:
        if folder is not None:
            _check_folder(Path(folder), read)


def _check_file(output: PathArg, part: Path, read: List[Tuple[PathArg, Path]]) -> None:
    shown = _shown(output, part, "written with")
    for source, file in read:
        if same_file(part, file):
            raise SameFileError(f"the output {shown} is the input {_shown(source, file)}: "
                                "choose another output path (an input is never overwritten)")
    if part.is_dir():
        raise OutputIsFolder(f"the output {shown} is a folder: name a file to write")
    blocker = _file_above(part)
    if blocker is not None:
        raise OutputRefused(f"the output {shown} cannot be written: {blocker} is a file, "
                            "not a folder")


def _check_folder(folder: Path, read: List[Tuple[PathArg, Path]]) -> None:
    if folder.exists() and not folder.is_dir():
        raise OutputRefused(f"the output folder {folder} exists and is not a folder")
    blocker = _file_above(folder)
    if blocker is not None:
        raise OutputRefused(f"the output folder {folder} cannot be made: {blocker} is a "
                            "file, not a folder")
    inside = os.path.realpath(folder)
    for source, file in read:
        if os.path.realpath(file).startswith(inside + os.sep):
            raise SameFileError(f"the output folder {folder} would replace the input "
                                f"{_shown(source, file)}: choose another output folder (an "
                                "input is never overwritten)")


def _shown(given: PathArg, part: Path, relation: str = "read with") -> str:
    """The user's path, and the companion's when the clash is there (``m.bin (read with
    m.xml)``)."""
    if part == Path(given):
        return os.fspath(given)
    return f"{part} ({relation} {os.fspath(given)})"


def _file_above(path: Path) -> Optional[Path]:
    """The nearest existing folder above ``path`` if it is not a folder (a file), else None."""
    parent = path.parent  # as the user wrote it (relative stays relative: "." ends it)
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return None if parent.is_dir() else parent
