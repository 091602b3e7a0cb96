"""Training end to end on tiny synthetic sets: loss goes down, files, resume, irpe eval."""
import json
import os
import stat

import pytest
import torch

from irpe.artifact.trained import load_trained, read_spec
from irpe.cli import main
from irpe.training.train import TrainConfig, Trainer, train

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


# ---- issue 20: val classes, exact resume, COCO optional fields, detector categories ----

@pytest.fixture(scope="module")
def cls_dir(tmp_path_factory):
    """A 16 + 16 image shapes ImageFolder (2 per class and split)."""
    from irpe.data.shapes import write_classification
    root = tmp_path_factory.mktemp("cls") / "shapes"
    write_classification(str(root), num_train=16, num_val=16)
    return root


@pytest.fixture(scope="module")
def det_dir(tmp_path_factory):
    """A 4 + 6 image shapes COCO directory."""
    from irpe.data.shapes import write_detection
    root = tmp_path_factory.mktemp("det") / "shapes"
    write_detection(str(root), num_train=4, num_val=6)
    return root


def _copy(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def test_train_checks_val_class_folders_at_start(cls_dir, tmp_path, capsys):
    import shutil
    args = ["train", "cls", "--model", "deit_shapes_irpe", "--batch-size", "4", "--max-steps",
            "1", "--threads", "1", "--no-progress"]
    missing = _copy(cls_dir, tmp_path / "missing")
    shutil.rmtree(missing / "val" / "star")
    assert main([*args, "--data", str(missing), "--output", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert "class folders of" in err and "differ from the training classes (missing ['star'])" \
        in err and "7 vs 8 classes" in err
    assert not (tmp_path / "o1" / "log.jsonl").exists()  # refused before any training
    extra = _copy(cls_dir, tmp_path / "extra")
    shutil.copytree(extra / "val" / "star", extra / "val" / "zebra")
    assert main([*args, "--data", str(extra), "--output", str(tmp_path / "o2")]) == 2
    assert "(extra ['zebra'])" in capsys.readouterr().err
    # irpe eval says the same about the model's classes
    assert main(["eval", "deit_shapes_irpe", "--data", str(missing), "--threads", "1"]) == 2
    assert "differ from the model's classes (missing ['star'])" in capsys.readouterr().err


def test_resume_equals_uninterrupted_run_bit_for_bit(tmp_path):
    kw = dict(epochs=2, mixup=0.8, drop_path=0.1, hflip=True)  # every random stream in use
    straight = train(_cfg(tmp_path / "a", "classification", "deit_shapes_irpe", **kw))
    cut = _cfg(tmp_path / "b", "classification", "deit_shapes_irpe", max_steps=3, **kw)
    train(cut)
    state = torch.load(tmp_path / "b" / "run" / "last.pt", weights_only=True)
    assert (state["epoch"], state["epoch_step"], state["step"]) == (0, 3, 3)
    resumed = train(_cfg(tmp_path / "b", "classification", "deit_shapes_irpe",
                         resume=str(tmp_path / "b" / "run" / "last.pt"), **kw))
    a = torch.load(tmp_path / "a" / "run" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "run" / "last.pt", weights_only=True)
    diff = max(float((a["model"][k] - b["model"][k]).abs().max()) for k in a["model"])
    print(f"resumed vs straight: max weight difference {diff}")
    assert diff == 0.0
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert resumed["train_loss"] == straight["train_loss"]
    assert (b["epoch"], b["step"], b["epoch_step"]) == (2, 8, 0)


def test_resume_refuses_another_class_count(cls_dir, tmp_path):
    import shutil

    from irpe.checkpoint import CheckpointError
    train(_cfg(tmp_path, "classification", "deit_shapes_irpe", max_steps=1))
    last = str(tmp_path / "run" / "last.pt")
    seven = _copy(cls_dir, tmp_path / "seven")
    for split in ("train", "val"):
        shutil.rmtree(seven / split / "star")
    with pytest.raises(CheckpointError, match=r"trained on 8 classes .* this dataset has 7"):
        Trainer(_cfg(tmp_path, "classification", "deit_shapes_irpe", data=str(seven),
                     resume=last))
    old = torch.load(last, weights_only=True)  # a file without the class list: shapes decide
    del old["classes"]
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="does not fit this model and dataset"):
        Trainer(_cfg(tmp_path, "classification", "deit_shapes_irpe", data=str(seven),
                     resume=str(tmp_path / "old.pt")))


def test_resume_from_a_file_that_is_not_a_checkpoint_is_one_line(cls_dir, tmp_path, capsys):
    from irpe.cli import main
    garbage = tmp_path / "last.pt"
    garbage.write_bytes(b"\x80\x02 truncated pickle, not a torch.save file")
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    for bad in (garbage, text):
        code = main(["train", "cls", "--model", "deit_shapes_irpe", "--data", str(cls_dir),
                     "--output", str(tmp_path / "run"), "--batch-size", "2",
                     "--resume", str(bad)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("irpe train: error: ") and len(err.splitlines()) == 1
        assert str(bad) in err and "Traceback" not in err


def test_resume_mid_epoch_needs_a_compatible_global_batch():
    from irpe.checkpoint import CheckpointError
    from irpe.training.state import resume_step
    state = {"epoch": 0, "epoch_step": 3, "global_batch": 8}
    assert resume_step(state, 8, "x") == 3 and resume_step(state, 4, "x") == 6
    assert resume_step(dict(state, epoch_step=0), 16, "x") == 0
    with pytest.raises(CheckpointError, match="not a multiple of this run's global batch 16"):
        resume_step(state, 16, "x")


def _rewrite_coco(root, split, fn):
    path = root / "annotations" / f"instances_{split}.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps(fn(data)))


def _eval_det(data, tmp_path, name):
    out = str(tmp_path / f"{name}.json")
    code = main(["eval", "detr_shapes_irpe", "--data", str(data), "--threads", "1",
                 "--json", out])
    return code, (json.load(open(out))["metrics"] if code == 0 else None)


def test_coco_without_iscrowd_and_area(det_dir, tmp_path):
    bare = _copy(det_dir, tmp_path / "bare")

    def strip(data):
        for ann in data["annotations"]:
            ann.pop("iscrowd"), ann.pop("area")
        return data
    for split in ("train", "val"):
        _rewrite_coco(bare, split, strip)
    _, full = _eval_det(det_dir, tmp_path, "full")
    code, got = _eval_det(bare, tmp_path, "bare")
    assert code == 0 and got == full  # area = w * h, iscrowd = 0: what the writer puts there
    record = train(_cfg(tmp_path, "detection", "detr_shapes_irpe", data=str(bare),
                        batch_size=2, max_steps=1, weight_decay=1e-4))
    assert "val_AP50" in record and (tmp_path / "run" / "model.safetensors").exists()


def test_last_pt_is_written_before_evaluation(det_dir, tmp_path):
    from irpe.data import ImageError
    broken = _copy(det_dir, tmp_path / "broken")
    (broken / "val" / "000002.png").write_bytes(b"not a png")
    with pytest.raises(ImageError):
        train(_cfg(tmp_path, "detection", "detr_shapes_irpe", data=str(broken), batch_size=2,
                   weight_decay=1e-4))
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (1, 2)  # the epoch's training is kept


def test_eval_detector_checks_categories_and_maps_ids_by_name(det_dir, tmp_path, capsys):
    _, ref = _eval_det(det_dir, tmp_path, "ref")
    three = _copy(det_dir, tmp_path / "three")

    def keep3(data):
        data["categories"] = data["categories"][:3]
        ids = {c["id"] for c in data["categories"]}
        data["annotations"] = [a for a in data["annotations"] if a["category_id"] in ids]
        return data
    _rewrite_coco(three, "val", keep3)
    code, _ = _eval_det(three, tmp_path, "three")
    err = capsys.readouterr().err
    assert code == 2 and "differ from the model's classes" in err and "3 vs 8 classes" in err
    with pytest.raises(ValueError, match=r"categories of instances_val.json differ .*3 vs 8"):
        Trainer(_cfg(tmp_path, "detection", "detr_shapes_irpe", data=str(three)))
    permuted = _copy(det_dir, tmp_path / "permuted")

    def reverse_ids(data):  # same names, ids 1..8 reversed: labels must map by name
        new = {c["id"]: 9 - c["id"] for c in data["categories"]}
        for c in data["categories"]:
            c["id"] = new[c["id"]]
        for a in data["annotations"]:
            a["category_id"] = new[a["category_id"]]
        return data
    _rewrite_coco(permuted, "val", reverse_ids)
    code, got = _eval_det(permuted, tmp_path, "permuted")
    # equal up to the order pycocotools averages the categories in
    assert code == 0 and got == pytest.approx(ref, abs=1e-12) and ref["AP50"] > 0
    with pytest.raises(ValueError, match=r"differ from the training categories \(same names, "
                       r"other order\)"):
        Trainer(_cfg(tmp_path, "detection", "detr_shapes_irpe", data=str(permuted)))


def test_saved_checkpoint_has_an_ordinary_file_mode(tmp_path):
    from irpe.checkpoint import save_checkpoint
    save_checkpoint(torch.nn.Linear(2, 2), str(tmp_path / "m.safetensors"))
    (tmp_path / "plain").write_bytes(b"")
    modes = {stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in ("m.safetensors", "plain")}
    assert len(modes) == 1 and os.listdir(tmp_path) != []  # no temporary file left behind
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "plain"]
