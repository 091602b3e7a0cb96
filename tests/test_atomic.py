"""irpe.atomic, the one home of the atomic-write rule (docs/DECISIONS.md), and the writers that
use it: a result appears complete or not at all (several files: moved in order, SIGINT held),
a failed or interrupted write leaves neither its temporary nor the folders it created, a write
the system refuses names the target, an output that is an input is refused (irpe.outputs)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from irpe.atomic import (
    WriteFailed,
    atomic_dir,
    atomic_files,
    atomic_open,
    atomic_path,
    held_interrupts,
    temp_name,
    write_bytes,
    write_text,
)
from irpe.outputs import SameFileError, check_outputs, same_file

ROOT = Path(__file__).resolve().parents[1]


def _entries(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir())


def test_a_file_appears_complete_and_its_temporary_is_beside_it(tmp_path):
    target = tmp_path / "a" / "b" / "out.bin"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".out.bin.tmp-")
        tmp.write_bytes(b"half")
        assert not target.exists()
        tmp.write_bytes(b"whole")
    assert target.read_bytes() == b"whole" and _entries(target.parent) == ["out.bin"]
    write_text(target, "again")
    assert target.read_text() == "again" and _entries(target.parent) == ["out.bin"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # not mkstemp's 0600


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_target_and_no_new_folder(tmp_path, error):
    old = tmp_path / "old.bin"
    old.write_bytes(b"old")
    with pytest.raises(type(error)):
        with atomic_open(old, "wb") as handle:
            handle.write(b"new, partial")
            raise error
    assert old.read_bytes() == b"old" and _entries(tmp_path) == ["old.bin"]
    with pytest.raises(type(error)):
        with atomic_path(tmp_path / "x" / "y" / "new.bin") as tmp:
            tmp.write_bytes(b"partial")
            raise error
    assert _entries(tmp_path) == ["old.bin"]  # x/ and x/y/ were this write's: removed


def test_a_writer_that_wrote_nothing_or_a_folder_target_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="wrote nothing"):
        with atomic_path(tmp_path / "none.bin"):
            pass
    with pytest.raises(IsADirectoryError, match="is a folder"):
        write_bytes(tmp_path, b"x")
    assert _entries(tmp_path) == []


def test_several_files_move_in_order_or_none_does(tmp_path, monkeypatch):
    first, last = tmp_path / "m.bin", tmp_path / "m.xml"
    with pytest.raises(RuntimeError):
        with atomic_files([first, last]) as (a, b):
            a.write_bytes(b"weights")
            raise RuntimeError("before the moves")
    assert _entries(tmp_path) == []
    moved = []
    real = os.replace

    def replace(src, dst):
        moved.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with atomic_files([first, last]) as (a, b):
        a.write_bytes(b"weights")
        b.write_bytes(b"graph")
    assert moved == ["m.bin", "m.xml"] and _entries(tmp_path) == ["m.bin", "m.xml"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_refused_write_names_the_target_not_the_temporary(tmp_path):
    for target in ("/proc/x.yaml", "/proc/sub/x.yaml"):
        with pytest.raises(WriteFailed, match=f"^cannot write {target}: ") as caught:
            write_text(target, "x")
        assert ".tmp-" not in str(caught.value)


def test_same_file_sees_paths_and_links(tmp_path):
    source = tmp_path / "in.onnx"
    source.write_bytes(b"model")
    (tmp_path / "soft.onnx").symlink_to(source)
    os.link(source, tmp_path / "hard.onnx")
    for other in (source, tmp_path / "." / "in.onnx", tmp_path / "soft.onnx",
                  tmp_path / "hard.onnx", os.path.relpath(source)):
        assert same_file(other, source)
        with pytest.raises(SameFileError, match="is the input"):
            check_outputs([other], [None, source])
    assert not same_file(tmp_path / "other.onnx", source)
    check_outputs([tmp_path / "other.onnx"], [source, None])


@pytest.fixture
def sigint():
    """SIGINT's handler as the test sets it, restored after: a run started as a background
    job (`cmd &` in a script) inherits SIGINT ignored, and Python then keeps it ignored."""
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


def test_held_interrupts_deliver_a_ctrl_c_after_the_block(sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts():
            signal.raise_signal(signal.SIGINT)
            done.append("after the signal")  # still runs: the signal is held
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_held_interrupts_keep_an_ignored_ctrl_c_ignored(sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's
    done = []
    with held_interrupts():
        signal.raise_signal(signal.SIGINT)
        done.append("after the signal")
    assert done == ["after the signal"] and signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_a_folder_replaces_or_merges_only_when_complete(tmp_path):
    repo = tmp_path / "repo"
    with atomic_dir(repo) as stage:
        (stage / "m").mkdir()
        (stage / "m" / "config").write_text("1")
        assert not repo.exists()
    assert _entries(repo) == ["m"]
    (repo / "mine.txt").write_text("kept")
    with pytest.raises(RuntimeError):
        with atomic_dir(repo, merge=True) as stage:
            (stage / "m").mkdir()
            (stage / "m" / "config").write_text("2")
            raise RuntimeError("half way")
    assert (repo / "m" / "config").read_text() == "1" and _entries(tmp_path) == ["repo"]
    with atomic_dir(repo, merge=True) as stage:
        (stage / "m").mkdir()
        (stage / "m" / "config").write_text("2")
    assert (repo / "m" / "config").read_text() == "2" and _entries(repo) == ["m", "mine.txt"]
    with atomic_dir(repo) as stage:
        (stage / "n").mkdir()
    assert _entries(repo) == ["n"] and _entries(tmp_path) == ["repo"]
    assert temp_name(repo).name.startswith(".repo.tmp-")


def test_an_interrupted_dataset_write_leaves_nothing(tmp_path, monkeypatch):
    from irpe.data import shapes
    real, calls = shapes.render_classification, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(shapes, "render_classification", flaky)
    with pytest.raises(KeyboardInterrupt):
        shapes.write_classification(tmp_path / "new" / "set", num_train=8, num_val=2, size=32)
    assert _entries(tmp_path) == []
    summary = shapes.write_classification(tmp_path / "set", num_train=8, num_val=2, size=32)
    assert summary["path"] == str(tmp_path / "set")
    assert _entries(tmp_path / "set") == ["shapes.json", "train", "val"]


def _irpe(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "irpe", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_export_and_validate_refuse_to_overwrite_their_input(tmp_path):
    weights = tmp_path / "m.safetensors"
    weights.write_bytes((ROOT / "irpe" / "demo" / "deit_shapes_irpe.safetensors").read_bytes())
    before = weights.read_bytes()
    done = _irpe("export", str(weights), "-o", str(weights), "-q")
    assert done.returncode == 2 and "is the input" in done.stderr, done.stderr
    assert weights.read_bytes() == before
    model = tmp_path / "m.onnx"
    assert _irpe("export", str(weights), "-o", str(model), "-q").returncode == 0
    onnx_bytes = model.read_bytes()
    done = _irpe("validate", str(model), "-n", "1", "--json", str(model))
    assert done.returncode == 2 and "is the input" in done.stderr, done.stderr
    assert model.read_bytes() == onnx_bytes and _entries(tmp_path) == ["m.onnx", "m.safetensors"]
