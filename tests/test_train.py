"""Training end to end on tiny synthetic sets: loss goes down, files, resume, irpe eval."""
import json
import os

import pytest
import torch

from irpe.artifact import load_trained, read_spec
from irpe.cli import main
from irpe.engine.train import TrainConfig, Trainer, train

SMALL_DEIT = dict(embed_dim=48, depth=2, num_heads=2)


def _cfg(tmp_path, task, model, **kw):
    base = dict(task=task, model=model, data="shapes", output=str(tmp_path / "run"), epochs=1,
                batch_size=8, shapes_train=32, shapes_val=16, progress=False, threads=1,
                warmup_epochs=0.0)
    base.update(kw)
    return TrainConfig(**base)


def _repeat_steps(trainer, batch, steps):
    """Loss on one fixed batch before and after ``steps`` optimiser steps on it."""
    losses = []
    for _ in range(steps):
        loss, _ = trainer.train_step(batch)
        losses.append(loss)
    return losses


def test_classification_steps_reduce_loss(tmp_path):
    trainer = Trainer(_cfg(tmp_path, "classification", "deit_shapes_irpe", lr=1e-3,
                           drop_path=0.0, label_smoothing=0.0, hflip=False,
                           epochs=50))
    batch = next(iter(trainer.train_loader))
    losses = _repeat_steps(trainer, batch, 8)
    assert losses[-1] < 0.7 * losses[0]


def test_detection_steps_reduce_loss(tmp_path):
    trainer = Trainer(_cfg(tmp_path, "detection", "detr_shapes_irpe", lr=1e-3, lr_backbone=1e-3,
                           weight_decay=1e-4, clip_grad=1.0, hflip=False,
                           epochs=50))  # long schedule: no cosine decay within the 10 steps
    batch = next(iter(trainer.train_loader))
    losses = _repeat_steps(trainer, batch, 10)
    assert losses[-1] < 0.75 * losses[0]


def test_training_writes_model_log_and_resumes(tmp_path):
    cfg = _cfg(tmp_path, "classification", "deit_shapes_irpe", epochs=2)
    record = train(cfg)
    run = tmp_path / "run"
    lines = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2] and record["epoch"] == 2
    assert lines[-1]["step"] == 2 * (32 // 8)
    assert 0 <= lines[-1]["val_top1"] <= 100
    model, spec = load_trained(str(run / "model.safetensors"))
    assert spec.class_names[:2] == ["circle", "cross"] and spec.task == "classification"
    _, meta = read_spec(str(run / "model.safetensors"))
    assert "irpe.train.val_top1" in meta
    # resume: a 3-epoch run continued from the 2-epoch state runs exactly one more epoch
    more = Trainer(_cfg(tmp_path, "classification", "deit_shapes_irpe", epochs=3,
                        resume=str(run / "last.pt")))
    assert (more.epoch, more.step) == (2, 8)
    assert more.run()["epoch"] == 3
    with pytest.raises(Exception, match="trained as"):
        Trainer(_cfg(tmp_path, "classification", "deit_tiny_patch16_224_ctx_product_50_shared_k",
                     resume=str(run / "last.pt")))


def test_detection_run_evaluates_coco_map_and_cli_eval(tmp_path, capsys):
    cfg = _cfg(tmp_path, "detection", "detr_shapes_irpe", max_steps=2, weight_decay=1e-4)
    record = train(cfg)
    assert {"val_AP", "val_AP50", "val_AP75"} <= set(record)
    model_file = str(tmp_path / "run" / "model.safetensors")
    model, spec = load_trained(model_file)  # trained with BatchNorm, served with frozen BN
    assert spec.task == "detection" and len(spec.class_names) == 8
    out = str(tmp_path / "m.json")
    assert main(["eval", model_file, "--data", "shapes", "--shapes-val", "8", "--threads", "1",
                 "--json", out]) == 0
    metrics = json.load(open(out))["metrics"]
    assert metrics["images"] == 8 and 0 <= metrics["AP50"] <= 1
    assert "AP50" in capsys.readouterr().out


def test_train_rejects_bad_input(tmp_path, capsys):
    with pytest.raises(ValueError, match="detection model"):
        Trainer(_cfg(tmp_path, "classification", "detr_shapes_irpe"))
    with pytest.raises(ValueError, match="task must be"):
        _cfg(tmp_path, "segmentation", "deit_shapes_irpe")
    assert main(["train", "cls", "--model", "deit_shapes_irpe", "--data", str(tmp_path / "nope"),
                 "--output", str(tmp_path / "o")]) == 2
    assert "data directory not found" in capsys.readouterr().err
    assert main(["train", "cls", "--model", "no_such_model", "--data", "shapes",
                 "--output", str(tmp_path / "o")]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["eval", "deit_tiny_patch16_224", "--data", "shapes"]) == 2
    assert "no bundled weights" in capsys.readouterr().err
