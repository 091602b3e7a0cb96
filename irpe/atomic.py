"""Atomic writes of output files and folders: every writer in irpe/, export/ and serve/ uses this.

The rule (docs/DECISIONS.md): an output path holds either what it held before or a complete
result, never a part of one, whatever stops the writer (an error, Ctrl-C, a full disk):

- a file is written to a temporary file beside it (``.NAME.tmp-PID``: the same folder, so
  ``os.replace`` is a rename within one file system), everything included (an ONNX file's
  metadata, an engine's sidecar), flushed and fsynced, then moved over the target;
- on any exception, KeyboardInterrupt included, the temporary is removed, and so are the
  folders the write created: an output's missing folders exist only after success;
- the move (and the clean-up) runs with SIGINT held, so a Ctrl-C lands before or after it,
  never half way; it is raised as KeyboardInterrupt once the step is done;
- an artifact of several files (an OpenVINO IR) is written by :func:`atomic_files`: all
  temporaries complete first, then moved in the order given, SIGINT held across the moves;
- a failure to write names the user's path, never the temporary (:class:`WriteFailed`).

Which paths a command may write at all (never one of its inputs, never a folder) is
:mod:`irpe.outputs`' part, checked before any work.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, List, Optional, Sequence

from .errors import ResourceError
from .outputs import OutputIsFolder, OutputRefused

__all__ = ["WriteFailed", "temp_name", "held_interrupts", "atomic_files",
           "atomic_path", "atomic_open", "write_bytes", "write_text", "atomic_dir"]

# errors of a write that carry no file name but are about the file written
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


class WriteFailed(ResourceError):
    """The system refused to write an output (permissions, a full disk, a file system that
    takes no new files): one line naming the output the user asked for."""


def temp_name(target: os.PathLike | str) -> Path:
    """The temporary beside ``target``: hidden, and no reader's suffix (``*.onnx`` globs skip
    it); a thread other than the main one adds its id, so two threads never share one."""
    target = Path(target)
    tag = str(os.getpid())
    if threading.current_thread() is not threading.main_thread():
        tag += f"-{threading.get_ident()}"
    return target.with_name(f".{target.name}.tmp-{tag}")


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold SIGINT for the block (main thread; elsewhere a no-op): a Ctrl-C received meanwhile
    is delivered when the block ends, to the handler that was there before."""
    try:
        previous = signal.getsignal(signal.SIGINT)
    except ValueError:
        previous = None
    if previous is None or threading.current_thread() is not threading.main_thread():
        yield  # a handler not set from Python cannot be restored: do not touch it
        return
    held: List[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and previous is not signal.SIG_IGN:
            if callable(previous):
                previous(signal.SIGINT, None)  # default_int_handler: KeyboardInterrupt
            else:
                signal.raise_signal(signal.SIGINT)  # SIG_DFL: the default action


def _make_parents(folder: Path) -> List[Path]:
    """Create ``folder`` and its missing parents; the ones created, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    created = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:  # another writer made it meanwhile: not ours to remove
            continue
        created.append(path)
    return created


def _remove_created(created: Sequence[Path]) -> None:
    for path in reversed(created):
        try:
            path.rmdir()  # only while empty: never what another writer put there
        except OSError:
            return


def _fsync(path: Path, folder: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    except OSError:
        if folder:
            return  # a folder that cannot be opened (some platforms): its rename still stands
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not folder:
            raise
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


@contextmanager
def atomic_files(targets: Sequence[os.PathLike | str]) -> Iterator[List[Path]]:
    """Yield a temporary path beside each of ``targets`` for the block to write completely;
    then fsync them and move each over its target, in the order given, with SIGINT held across
    all the moves. On any exception (KeyboardInterrupt too) the temporaries and the folders
    created for them are removed and the targets not yet moved are untouched.

    The moves are separate renames: a reader between two of them sees the new files moved so
    far beside the old others. An artifact of several files therefore moves the file a reader
    opens first last, and that file records what it expects of the others (an IR's ``.xml``
    the size and digest of its ``.bin``: :func:`irpe.artifact.openvino_ir.write_ir`)."""
    paths = [Path(target) for target in targets]
    for path in paths:
        if path.is_dir():
            raise OutputIsFolder(f"the output {path} is a folder: name a file to write")
    temps = [temp_name(path) for path in paths]
    created: List[Path] = []
    try:
        with _naming(paths, temps):
            for path in paths:
                created += _make_parents(path.parent)
            yield temps
            for path, tmp in zip(paths, temps, strict=True):
                if not tmp.is_file():
                    raise FileNotFoundError(f"the writer of {path} wrote nothing to {tmp}")
                _fsync(tmp)
            with held_interrupts():
                for path, tmp in zip(paths, temps, strict=True):
                    os.replace(tmp, path)
                for folder in dict.fromkeys(path.parent for path in paths):
                    _fsync(folder, folder=True)
    except BaseException:
        with held_interrupts():
            for tmp in temps:
                _discard(tmp)
            _remove_created(created)
        raise


@contextmanager
def atomic_path(target: os.PathLike | str) -> Iterator[Path]:
    """Yield a temporary path beside ``target`` for the block to write completely (any writer
    that takes a path: ``onnx.save``, ``torch.save``, ONNX Runtime's quantiser); then fsync it
    and move it over ``target``. On any exception (KeyboardInterrupt too) the temporary and the
    folders created for it are removed and ``target`` is untouched (:func:`atomic_files`)."""
    with atomic_files([target]) as (tmp,):
        yield tmp


@contextmanager
def _naming(targets: Sequence[Path], temps: Sequence[Path]) -> Iterator[None]:
    """Re-raise a system error about a temporary (or a folder made for a target, or a full
    disk) as :class:`WriteFailed` naming the target: the user never chose the temporary."""
    try:
        yield
    except OSError as exc:
        target = _written(exc, targets, temps)
        if target is None or isinstance(exc, ResourceError):
            raise
        raise WriteFailed(f"cannot write {target}: {exc.strerror or exc}") from exc


def _written(exc: OSError, targets: Sequence[Path], temps: Sequence[Path]) -> Optional[Path]:
    """The target ``exc`` is about, or None when it is about something else (an input)."""
    names = [os.path.abspath(name) for name in (exc.filename, exc.filename2)
             if isinstance(name, (str, os.PathLike))]
    if not names:
        return targets[-1] if exc.errno in _WRITE_ERRNOS else None
    for target, tmp in zip(targets, temps, strict=True):
        owned = [os.path.abspath(tmp), os.path.abspath(target)]
        owned += [os.path.abspath(folder) for folder in target.parents]
        for name in names:
            if name in owned or name.startswith(owned[0] + os.sep):
                return target
    return None


@contextmanager
def atomic_open(target: os.PathLike | str, mode: str = "w",
                encoding: Optional[str] = None) -> Iterator[IO]:
    """``open(target, mode)`` through :func:`atomic_path`: the file appears complete when the
    block ends, or not at all. ``mode`` is a write mode ("w", "wb")."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', got {mode!r}")
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    with atomic_path(target) as tmp:
        with open(tmp, mode, encoding=encoding) as handle:
            yield handle


def write_bytes(target: os.PathLike | str, data: bytes) -> Path:
    """Write ``data`` to ``target`` atomically; returns the path."""
    with atomic_open(target, "wb") as handle:
        handle.write(data)
    return Path(target)


def write_text(target: os.PathLike | str, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``target`` atomically; returns the path."""
    with atomic_open(target, "w", encoding=encoding) as handle:
        handle.write(text)
    return Path(target)


@contextmanager
def atomic_dir(target: os.PathLike | str, merge: bool = False) -> Iterator[Path]:
    """Yield a staging folder beside ``target`` for the block to fill; then move it into place.

    ``merge=False``: the staged folder replaces ``target`` as a whole. ``merge=True``: each
    entry staged replaces the entry of the same name in ``target`` (created if absent), the
    other entries of ``target`` are kept. A replaced entry is renamed aside and removed after
    the new one is in place, with SIGINT held throughout. On any exception the staging folder
    and the folders created for it are removed."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise OutputRefused(f"the output folder {target} exists and is not a folder")
    created = _make_parents(target.parent)
    stage = temp_name(target)
    _discard(stage)
    try:
        with _naming([target], [stage]):
            stage.mkdir()
            yield stage
            with held_interrupts():
                if merge and target.is_dir():
                    for entry in sorted(stage.iterdir()):
                        _swap(entry, target / entry.name)
                    stage.rmdir()
                else:
                    _swap(stage, target)
                _fsync(target.parent, folder=True)
    except BaseException:
        with held_interrupts():
            _discard(stage)
            _remove_created(created)
        raise


def _swap(new: Path, old: Path) -> None:
    """Put ``new`` at ``old``'s path; an existing ``old`` is renamed aside, then removed."""
    aside = old.with_name(f".{old.name}.old-{os.getpid()}")
    if old.exists() or old.is_symlink():
        _discard(aside)
        os.replace(old, aside)
    os.replace(new, old)
    _discard(aside)
