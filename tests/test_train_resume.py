"""A resumed run writes the bytes the run straight through writes (issue 50, defects 6 and 7).

Every case is real `irpe train` runs on the tiny synthetic sets: a run straight through 2
epochs of 4 steps, and the same run stopped by ``--max-steps`` (mid-epoch 1, at the end of
epoch 1, mid-epoch 2) then continued with ``--resume``. ``model.safetensors`` and ``last.pt``
must be equal byte for byte: the best is chosen over completed epochs only (a partial epoch
that ties the completed one used to stay the best), and neither file records how the run was
driven (output folder, --resume, --max-steps).
"""
import os
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

from irpe.cli import main

COMMON = ["--data", "shapes", "--epochs", "2", "--threads", "1", "--no-progress",
          "--device", "cpu"]
TASKS = {  # 4 steps an epoch either way: 32 / 8 and 16 / 4 images
    "cls": ["--model", "deit_shapes_irpe", "--shapes-train", "32", "--shapes-val", "16",
            "--warmup-epochs", "0"],
    "det": ["--model", "detr_shapes_irpe", "--shapes-train", "16", "--shapes-val", "4"],
}
SPLITS = {  # global batch as one batch, or as 2 accumulated micro-batches
    ("cls", 1): ["--batch-size", "8"],
    ("cls", 2): ["--batch-size", "4", "--grad-accum-steps", "2"],
    ("det", 1): ["--batch-size", "4"],
    ("det", 2): ["--batch-size", "2", "--grad-accum-steps", "2"],
}
FILES = ("model.safetensors", "last.pt")


def _train(capsys, task: str, accum: int, out: Path, *extra: str) -> Tuple[int, str, str]:
    """`irpe train TASK ...` in this process: (exit code, stdout, stderr)."""
    code = main(["train", task, *TASKS[task], *COMMON, *SPLITS[(task, accum)],
                 "--output", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class Straight:
    """The uninterrupted runs, made on first use (one per task and split) and shared."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: Dict[Tuple[str, int], Path] = {}

    def get(self, capsys, task: str, accum: int) -> Path:
        if (task, accum) not in self.runs:
            out = self.root / f"{task}{accum}"
            assert _train(capsys, task, accum, out)[0] == 0
            self.runs[(task, accum)] = out
        return self.runs[(task, accum)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Straight:
    return Straight(tmp_path_factory.mktemp("straight"))


CASES: List[Tuple[str, int, int]] = [
    *[("cls", accum, stop) for accum in (1, 2) for stop in (3, 4, 6)],
    *[("det", accum, stop) for accum in (1, 2) for stop in (3, 4)],
]


@pytest.mark.parametrize("task,accum,stop", CASES)
def test_a_resumed_run_writes_the_uninterrupted_runs_bytes(capsys, straight, tmp_path, task,
                                                           accum, stop):
    ref = straight.get(capsys, task, accum)
    cut = tmp_path / "cut"
    code, out, _ = _train(capsys, task, accum, cut, "--max-steps", str(stop))
    assert code == 0
    if stop == 3:  # before any epoch completed: a provisional model, said so
        assert "before epoch 1 completed" in out and "provisional" in out
    code, out, _ = _train(capsys, task, accum, cut, "--resume", str(cut / "last.pt"))
    assert code == 0 and "after 2 epochs" in out
    for name in FILES:
        assert (cut / name).read_bytes() == (ref / name).read_bytes(), name
    state = torch.load(cut / "last.pt", weights_only=True)
    assert (state["epoch"], state["step"], state["epoch_step"]) == (2, 8, 0)
    assert "resume" not in state["config"] and "max_steps" not in state["config"]


def test_a_partial_epoch_is_logged_but_never_the_best(capsys, tmp_path):
    from irpe.artifact.trained import read_spec
    run = tmp_path / "run"
    assert _train(capsys, "det", 1, run, "--max-steps", "3")[0] == 0  # AP 0 every epoch: ties
    _, meta = read_spec(str(run / "model.safetensors"))
    assert meta["irpe.train.partial"] == "3 of 4 steps"  # provisional: no epoch completed
    assert _train(capsys, "det", 1, run, "--resume", str(run / "last.pt"), "--max-steps",
                  "6")[0] == 0
    _, meta = read_spec(str(run / "model.safetensors"))
    assert meta["irpe.train.epoch"] == "1" and "irpe.train.partial" not in meta
    state = torch.load(run / "last.pt", weights_only=True)
    assert (state["epoch"], state["epoch_step"], state["best"]) == (1, 2, 0.0)
    lines = (run / "log.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"partial": true' in lines[2] and '"partial"' not in lines[1]


def test_the_global_batch_message_names_the_accumulation(capsys, tmp_path):
    cut = tmp_path / "cut"
    assert _train(capsys, "cls", 2, cut, "--max-steps", "3")[0] == 0  # 4 x 1 x 2, 24 samples
    code = main(["train", "cls", *TASKS["cls"], *COMMON, "--batch-size", "16", "--output",
                 str(cut), "--resume", str(cut / "last.pt")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "not a multiple of this run's global batch 16" in err
    assert "--batch-size x processes x --grad-accum-steps; it ran 4 x 1 x 2" in err


def test_resuming_a_finished_run_says_so_and_writes_nothing(capsys, straight):
    run = straight.get(capsys, "cls", 1)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    for epochs in ("1", "2"):
        code, out, err = _train(capsys, "cls", 1, run, "--resume", str(run / "last.pt"),
                                "--epochs", epochs)
        assert code == 0 and err == "" and len(out.splitlines()) == 1, out
        assert f"nothing to train: {run / 'last.pt'} already completed 2 epochs " \
               f"(--epochs {epochs})" in out
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    assert after == before and sorted(os.listdir(run)) == ["last.pt", "log.jsonl",
                                                           "model.safetensors"]
