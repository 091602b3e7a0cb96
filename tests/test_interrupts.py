"""Ctrl-C in `irpe` commands (issue 50, defect 8): one line `irpe COMMAND: interrupted`, exit
130, nothing half-written, and no "wrote" / "done" line once the Ctrl-C has arrived.

Real processes and real SIGINTs: sent to the whole process group as a terminal does (the
DataLoader's worker gets it too), or by tests/sigint_at_move.py at the exact moment a file
moves into place (the Ctrl-C is then held by irpe.atomic and delivered after the move: the
file is complete and kept, and the command still reports itself interrupted, not done)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

import torch

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "cls", "--model", "deit_shapes_irpe", "--data", "shapes", "--shapes-train",
         "32", "--shapes-val", "16", "--batch-size", "8", "--warmup-epochs", "0", "--threads",
         "1", "--no-progress", "--device", "cpu"]
LINE = "irpe {}: interrupted"


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


def _at_move(suffix: str, *argv: str) -> subprocess.CompletedProcess:
    """`irpe ARGV` with a Ctrl-C arriving as the file ending in ``suffix`` moves into place."""
    return subprocess.run([sys.executable, str(ROOT / "tests" / "sigint_at_move.py"), suffix,
                           *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=_env())


def _irpe(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "irpe", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=_env())


def _own_lines(stderr: str, command: str) -> List[str]:
    """stderr without the progress lines a command prints there by design ([export] ...)."""
    return [line for line in stderr.splitlines() if not line.startswith(f"[{command}]")]


def _interrupted(done: subprocess.CompletedProcess, command: str) -> None:
    assert done.returncode == 130, (done.returncode, done.stderr[-3000:])
    assert _own_lines(done.stderr, command) == [LINE.format(command)], done.stderr[-3000:]


def _no_temporaries(folder: Path) -> None:
    assert [name for name in os.listdir(folder) if ".tmp" in name] == []


def test_ctrl_c_while_training_is_one_line_and_exit_130(tmp_path):
    import signal as sig  # (the child must see SIGINT's default action: see tests/helpers.py)
    previous = sig.signal(sig.SIGINT, sig.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "irpe", *TRAIN, "--epochs", "200",
                                 "--workers", "1", "--output", str(tmp_path / "run")],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_env(), start_new_session=True)
    finally:
        sig.signal(sig.SIGINT, previous)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # epoch 1's record: training, writing and evaluating go on
    assert first.startswith("train_loss="), first + proc.communicate()[1]
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole process group
    out, err = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, first + out, err)
    _interrupted(done, "train")
    assert "done:" not in done.stdout
    run = tmp_path / "run"
    _no_temporaries(run)
    state = torch.load(run / "last.pt", weights_only=True)  # complete: it loads
    assert state["epoch"] >= 1


def test_ctrl_c_under_torchrun_is_one_line_of_ours(tmp_path):
    """Ctrl-C to a 2-process torchrun: rank 0's line stands for the run (the other rank is
    silent), nothing half-written. torchrun's own exit status and SignalException traceback
    are the launcher's (docs/training.md says so), not irpe's."""
    import signal as sig
    env = dict(_env(), GLOO_SOCKET_IFNAME="lo")
    previous = sig.signal(sig.SIGINT, sig.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node=2", "-m", "irpe", *TRAIN, "--epochs", "200",
                                 "--output", str(tmp_path / "run")],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, start_new_session=True)
    finally:
        sig.signal(sig.SIGINT, previous)
    assert proc.stdout is not None
    seen = ""
    while not seen.startswith("train_loss="):  # after the run's notes: epoch 1's record
        seen = proc.stdout.readline()
        assert seen, proc.communicate()[1]
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    ours = [line for line in err.splitlines() if line.startswith("irpe ")]
    assert ours == [LINE.format("train")], err[-3000:]
    assert "done:" not in out
    _no_temporaries(tmp_path / "run")
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["epoch"] >= 1


def test_ctrl_c_held_during_the_final_write_reports_no_success(tmp_path):
    run = tmp_path / "run"
    done = _at_move("model.safetensors", *TRAIN, "--epochs", "1", "--output", str(run))
    _interrupted(done, "train")
    assert "done:" not in done.stdout and "train_loss=" not in done.stdout  # logged after
    _no_temporaries(run)
    from irpe.artifact.trained import read_spec
    _, meta = read_spec(str(run / "model.safetensors"))  # moved while held: complete, kept
    state = torch.load(run / "last.pt", weights_only=True)  # written with it, Ctrl-C held
    assert meta["irpe.train.epoch"] == "1" and float(meta["irpe.train.val_top1"]) == \
        round(state["best"], 4) and state["epoch"] == 1
    # the log line (written after the files) is missing: resumed, the epoch is evaluated again,
    # ties its own best and is logged; the files stay as they are
    files = {name: (run / name).read_bytes() for name in ("model.safetensors", "last.pt")}
    again = _irpe(*TRAIN, "--epochs", "1", "--output", str(run), "--resume", str(run / "last.pt"))
    assert again.returncode == 0 and "done: best" in again.stdout, again.stderr
    assert files == {name: (run / name).read_bytes() for name in files}
    assert '"epoch": 1' in (run / "log.jsonl").read_text()


def test_a_run_stopped_before_evaluating_resumes_to_the_same_bytes(tmp_path):
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert _irpe(*TRAIN, "--epochs", "2", "--output", str(straight)).returncode == 0
    # the Ctrl-C lands as epoch 1's last.pt moves: before epoch 1 is evaluated
    _interrupted(_at_move("last.pt", *TRAIN, "--epochs", "2", "--output", str(cut)), "train")
    assert not (cut / "model.safetensors").exists() and not (cut / "log.jsonl").exists()
    done = _irpe(*TRAIN, "--epochs", "2", "--output", str(cut), "--resume", str(cut / "last.pt"))
    assert done.returncode == 0, done.stderr
    for name in ("model.safetensors", "last.pt"):
        assert (cut / name).read_bytes() == (straight / name).read_bytes(), name
    # the same evaluations logged (epoch 1's training loss went with the interrupted process)
    assert _evaluations(cut) == _evaluations(straight)


def _evaluations(run: Path) -> List[tuple]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return [(r["epoch"], r["step"], r["val_top1"], r["val_loss"]) for r in records]


def test_ctrl_c_held_during_export_and_quantize_writes(tmp_path):
    import onnx
    model = tmp_path / "m.onnx"
    done = _at_move(".onnx", "export", "deit_shapes_irpe", "--output", str(model))
    _interrupted(done, "export")
    assert "wrote" not in done.stdout + done.stderr
    onnx.checker.check_model(onnx.load(str(model)))  # moved while the Ctrl-C was held: kept
    int8 = tmp_path / "m.int8.onnx"
    done = _at_move(".int8.onnx", "quantize", str(model), "--mode", "dynamic", "--output",
                    str(int8))
    _interrupted(done, "quantize")
    assert "wrote" not in done.stdout
    onnx.checker.check_model(onnx.load(str(int8)))
    _no_temporaries(tmp_path)


def _importing_torch(pid: int) -> bool:
    """Whether process ``pid`` has begun importing torch (its C++ library is mapped): past
    Python's own start, inside the seconds the `irpe` command spends importing."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # it has exited since the poll: the signal's answer will say how
        return True


def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path):
    """A Ctrl-C while `irpe` still imports its command line and torch (a second or more, from
    the moment torch's library is mapped): one line, exit 130, no traceback, nothing
    written. (A Ctrl-C in Python's own first milliseconds, while it imports `site`, is
    Python's to report.)"""
    # the child must see SIGINT's default action even where this run ignores it (a CI job in
    # the background): exec resets a handler to the default, an ignored signal stays ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "irpe", "export", "deit_shapes_irpe",
                                 "-o", str(tmp_path / "m.onnx"), "-q"], cwd=ROOT, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        for _ in range(30000):  # torch is mapped within a second or two of the start
            if proc.poll() is not None or _importing_torch(proc.pid):
                break
            threading.Event().wait(0.001)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 1, (proc.returncode, err[-3000:])
    assert lines[0] in ("irpe: interrupted", LINE.format("export")), err
    assert "Traceback" not in err and os.listdir(tmp_path) == []
