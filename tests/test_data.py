"""Synthetic shapes sets, dataset readers, collate and the ``irpe data`` command."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from irpe.box_ops import box_iou
from irpe.cli import main
from irpe.data import (
    SHAPE_CLASSES,
    CocoDetection,
    ImageFolder,
    Preprocess,
    ShapesClassification,
    ShapesDetection,
    collate_detection,
    render_classification,
    render_detection,
    write_classification,
    write_detection,
)
from irpe.data.shapes import classification_scene, detection_scene

LUMA = np.array([0.299, 0.587, 0.114])


def pixels(image):
    return np.asarray(image, dtype=np.uint8)


def xyxy(annotations):
    return torch.tensor([[x, y, x + w, y + h] for x, y, w, h in
                         (a["bbox"] for a in annotations)], dtype=torch.float64)


def check_scene(scene, image, annotations):
    """Painted pixels == union of masks; each box is the tight box of its shape's pixels."""
    changed = (pixels(image) != scene.background).any(-1)
    union = np.zeros_like(changed)
    for shape, ann in zip(scene.shapes, annotations, strict=True):
        assert not (union & shape.mask).any()  # shapes never cover each other
        union |= shape.mask
        ys, xs = np.nonzero(changed & shape.mask)
        x, y, w, h = ann["bbox"]
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x, y, x + w, y + h)
        assert ann["area"] == w * h and ann["category_id"] == shape.label + 1
        contrast = np.abs(scene.background[shape.mask] @ LUMA - shape.colour @ LUMA)
        assert contrast.min() >= 50, "shape must stand out from the background everywhere"
    assert np.array_equal(changed, union)


def test_classes_sorted_like_imagefolder():
    assert SHAPE_CLASSES == tuple(sorted(SHAPE_CLASSES)) and len(SHAPE_CLASSES) == 8
    assert {"circle", "ring", "square", "diamond"} <= set(SHAPE_CLASSES)


def test_classification_deterministic_and_streams_differ():
    a, label = render_classification(3, 17)
    b, label_b = render_classification(3, 17)
    assert a.mode == "RGB" and a.size == (64, 64) and label == label_b == 17 % 8
    assert np.array_equal(pixels(a), pixels(b))
    others = [render_classification(4, 17)[0], render_classification(3, 25)[0],
              render_classification(3, 17, split="val")[0]]
    assert all(not np.array_equal(pixels(a), pixels(o)) for o in others)


def test_classification_balanced_and_inside():
    labels = [render_classification(0, i, size=48)[1] for i in range(64)]
    assert np.bincount(labels, minlength=8).tolist() == [8] * 8
    for i in range(48):
        scene = classification_scene(1, i, size=48)
        image, label = render_classification(1, i, size=48)
        check_scene(scene, image, scene.annotations())
        x, y, w, h = scene.shapes[0].box()
        assert 0.25 * 48 <= max(w, h) <= 0.8 * 48 + 2  # 35%-80% circumscribed diameter
        if SHAPE_CLASSES[label] in ("circle", "ring"):  # clipped by the border: no longer round
            assert abs(w - h) <= 1


def test_ring_has_a_hole_circle_does_not():
    for i in (0, 4, 8, 12):  # index % 8: 0 circle, 4 ring
        mask = classification_scene(0, i).shapes[0].mask
        x, y, w, h = (int(v) for v in classification_scene(0, i).shapes[0].box())
        centre = mask[y + h // 2 - 1:y + h // 2 + 2, x + w // 2 - 1:x + w // 2 + 2]
        assert centre.all() if SHAPE_CLASSES[i % 8] == "circle" else not centre.any()


def test_detection_deterministic_tight_and_separated():
    counts = []
    for i in range(30):
        image, annotations = render_detection(5, i, size=96, max_objects=4)
        again = render_detection(5, i, size=96, max_objects=4)
        assert np.array_equal(pixels(image), pixels(again[0])) and annotations == again[1]
        check_scene(detection_scene(5, i, size=96, max_objects=4), image, annotations)
        counts.append(len(annotations))
        boxes = xyxy(annotations)
        iou = box_iou(boxes, boxes)[0] - torch.eye(len(boxes), dtype=torch.float64)
        assert iou.max() <= 0.05
        sides = (boxes[:, 2:] - boxes[:, :2]).max(1).values
        # 15%-40% circumscribed diameter; filling the outline may add a pixel on each side
        assert sides.min() >= 0.08 * 96 and sides.max() <= 0.4 * 96 + 2
        assert all(isinstance(v, float) for a in annotations for v in a["bbox"])
    assert min(counts) >= 1 and max(counts) == 4 and len(set(counts)) > 2
    first = render_detection(5, 0, size=96, max_objects=4)[0]
    assert not np.array_equal(pixels(first), pixels(render_detection(
        5, 0, size=96, max_objects=4, split="val")[0]))


def test_detection_one_object_and_all_classes_occur():
    seen = set()
    for i in range(40):
        annotations = render_detection(0, i, size=64, max_objects=1)[1]
        assert len(annotations) == 1
        seen.add(annotations[0]["category_id"])
    assert seen == set(range(1, 9))


@pytest.mark.parametrize("call", [
    lambda: render_classification(-1, 0), lambda: render_classification(0, -1),
    lambda: render_classification(0, 0, split="holdout"), lambda: render_classification(0, 0, 16),
    lambda: render_classification(1.5, 0), lambda: render_detection(0, 0, size=48),
    lambda: render_detection(0, 0, max_objects=0), lambda: ShapesClassification(-1),
    lambda: ShapesDetection(3, split="nope"), lambda: ShapesClassification(2.0),
])
def test_bad_arguments(call):
    with pytest.raises(ValueError):
        call()


def test_write_refuses_bad_counts_before_writing(tmp_path):
    with pytest.raises(ValueError, match="num_train"):
        write_classification(tmp_path / "c", num_train=-1)
    with pytest.raises(ValueError, match="detection image size"):
        write_detection(tmp_path / "d", 2, 2, size=32)
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_imagefolder_round_trip(tmp_path):
    summary = write_classification(tmp_path, num_train=16, num_val=8, seed=2, size=32)
    assert summary["splits"]["train"]["per_class"] == dict.fromkeys(SHAPE_CLASSES, 2)
    assert summary["splits"]["val"]["images"] == 8
    for split, num in (("train", 16), ("val", 8)):
        folder = ImageFolder(str(tmp_path / split))
        memory = ShapesClassification(num, seed=2, size=32, split=split)
        assert folder.classes == memory.classes == list(SHAPE_CLASSES) and len(folder) == num
        assert [p for p, _ in folder.samples] == sorted(p for p, _ in folder.samples)
        for (path, label), (image, label2) in zip(folder.samples, folder, strict=True):
            ref, ref_label = memory[int(Path(path).stem)]
            assert label == label2 == ref_label and np.array_equal(pixels(image), pixels(ref))


def test_imagefolder_formats_and_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ImageFolder(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no class directories"):
        ImageFolder(str(tmp_path))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "readme.txt").write_text("not an image")
    with pytest.raises(ValueError, match="has no images"):
        ImageFolder(str(tmp_path))
    image = Image.new("RGB", (5, 4), (9, 8, 7))
    for name in ("x.JPG", "y.webp", "sub/z.bmp"):
        (tmp_path / "b" / name).parent.mkdir(exist_ok=True)
        image.save(tmp_path / "b" / name)
    (tmp_path / "a").mkdir()
    image.save(tmp_path / "a" / "p.png")
    (tmp_path / ".hidden").mkdir()
    folder = ImageFolder(str(tmp_path), transform=Preprocess(size=4, crop_pct=1.0))
    assert folder.classes == ["a", "b"] and [lbl for _, lbl in folder.samples] == [0, 1, 1, 1]
    assert folder[0][0].shape == (3, 4, 4) and folder[-1][1] == 1
    with pytest.raises(IndexError):
        folder[4]


def test_shapes_classification_loader_batches_tensors():
    data = ShapesClassification(10, size=32, transform=Preprocess(size=32, crop_pct=1.0))
    images, labels = next(iter(DataLoader(data, batch_size=4)))
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == [0, 1, 2, 3]
    assert len(list(data)) == 10  # iteration stops at len (IndexError)


def test_detection_round_trip_and_pycocotools(tmp_path):
    from pycocotools.coco import COCO
    write_detection(tmp_path, num_train=6, num_val=3, seed=1, size=64, max_objects=3)
    for split, num in (("train", 6), ("val", 3)):
        path = tmp_path / "annotations" / f"instances_{split}.json"
        coco = COCO(str(path))
        memory = ShapesDetection(num, seed=1, size=64, max_objects=3, split=split)
        disk = CocoDetection(str(tmp_path), split)
        assert sorted(coco.getImgIds()) == list(range(1, num + 1))
        assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(SHAPE_CLASSES)
        assert disk.categories == memory.categories == list(SHAPE_CLASSES)
        assert disk.category_ids == memory.category_ids == list(range(1, 9))
        assert memory.coco_json() == json.loads(path.read_text()) == disk.coco_json()
        total = 0
        for i in range(num):
            (im_a, t_a), (im_b, t_b) = disk[i], memory[i]
            assert np.array_equal(pixels(im_a), pixels(im_b))
            assert t_a["image_id"] == t_b["image_id"] == i + 1
            assert torch.equal(t_a["labels"], t_b["labels"])
            assert torch.equal(t_a["boxes"], t_b["boxes"])
            assert len(coco.getAnnIds(imgIds=[i + 1])) == len(t_a["labels"])
            total += len(t_a["labels"])
        assert total == len(coco.getAnnIds())


def test_detection_target_format():
    data = ShapesDetection(2, seed=0, size=64, max_objects=3)
    image, target = data[1]
    annotations = render_detection(0, 1, size=64, max_objects=3)[1]
    assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
    assert target["orig_size"].tolist() == [64, 64] and target["image_id"] == 2
    x, y, w, h = annotations[0]["bbox"]
    expect = [(x + w / 2) / 64, (y + h / 2) / 64, w / 64, h / 64]
    assert torch.allclose(target["boxes"][0], torch.tensor(expect))
    assert target["labels"][0] == annotations[0]["category_id"] - 1


def make_coco(root, annotations, categories=({"id": 3, "name": "a"}, {"id": 7, "name": "b"})):
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "train").mkdir(exist_ok=True)
    Image.new("RGB", (40, 20)).save(root / "train" / "im.png")
    data = {"images": [{"id": 5, "file_name": "im.png", "width": 40, "height": 20}],
            "annotations": annotations, "categories": list(categories)}
    (root / "annotations" / "instances_train.json").write_text(json.dumps(data))


def test_coco_detection_hand_made(tmp_path):
    make_coco(tmp_path, [
        {"id": 1, "image_id": 5, "category_id": 7, "bbox": [10, 5, 20, 10], "iscrowd": 0},
        {"id": 2, "image_id": 5, "category_id": 3, "bbox": [0, 0, 40, 20], "iscrowd": 1},
        {"id": 3, "image_id": 5, "category_id": 3, "bbox": [30, 10, 20, 20], "iscrowd": 0}])
    data = CocoDetection(str(tmp_path), "train", transform=Preprocess("detection", min_size=10))
    image, target = data[0]
    assert data.categories == ["a", "b"] and data.category_ids == [3, 7]
    assert image.shape == (3, 10, 20) and target["image_id"] == 5
    assert target["orig_size"].tolist() == [20, 40]
    assert target["labels"].tolist() == [1, 0]  # crowd skipped; category 7 -> 1, 3 -> 0
    # second box clipped to the image: x 30..40, y 10..20
    assert torch.allclose(target["boxes"], torch.tensor([[0.5, 0.5, 0.5, 0.5],
                                                         [0.875, 0.75, 0.25, 0.5]]))


def test_coco_detection_errors(tmp_path):
    with pytest.raises(ValueError, match="no annotation file"):
        CocoDetection(str(tmp_path), "train")
    make_coco(tmp_path, [{"id": 1, "image_id": 5, "category_id": 9, "bbox": [0, 0, 1, 1]}])
    with pytest.raises(ValueError, match="unknown category"):
        CocoDetection(str(tmp_path))
    make_coco(tmp_path, [{"id": 1, "image_id": 6, "category_id": 3, "bbox": [0, 0, 1, 1]}])
    with pytest.raises(ValueError, match="unknown image"):
        CocoDetection(str(tmp_path))
    (tmp_path / "annotations" / "instances_train.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        CocoDetection(str(tmp_path))
    (tmp_path / "annotations" / "instances_train.json").write_text('{"images": []}')
    with pytest.raises(ValueError, match="missing annotations, categories"):
        CocoDetection(str(tmp_path))
    (tmp_path / "annotations" / "instances_val.json").write_text('{}')
    with pytest.raises(ValueError, match="no image directory"):
        CocoDetection(str(tmp_path), "val")


def test_collate_detection_pads_top_left():
    a, b = torch.rand(3, 10, 20), torch.rand(3, 15, 12)
    ta, tb = {"labels": torch.tensor([1])}, {"labels": torch.tensor([2, 3])}
    batch, sizes, targets = collate_detection([(a, ta), (b, tb)])
    assert batch.shape == (2, 3, 15, 20) and sizes.tolist() == [[10, 20], [15, 12]]
    assert torch.equal(batch[0, :, :10, :20], a) and torch.equal(batch[1, :, :15, :12], b)
    assert batch[0, :, 10:].abs().sum() == 0 and batch[1, :, :, 12:].abs().sum() == 0
    assert targets == [ta, tb]
    with pytest.raises(ValueError, match="tensor images"):
        collate_detection([ShapesDetection(1, size=64)[0]])
    with pytest.raises(ValueError, match="at least one"):
        collate_detection([])


def test_detection_loader():
    data = ShapesDetection(3, size=64, transform=Preprocess("detection", min_size=64,
                                                            max_size=64))
    images, sizes, targets = next(iter(DataLoader(data, batch_size=3,
                                                  collate_fn=collate_detection)))
    assert images.shape == (3, 3, 64, 64) and sizes.tolist() == [[64, 64]] * 3
    assert [t["image_id"] for t in targets] == [1, 2, 3]


def test_cli_writes_both_sets(tmp_path, capsys):
    out = tmp_path / "cls"
    assert main(["data", "shapes-cls", "--out", str(out), "--train", "16", "--val", "8",
                 "--size", "32", "--seed", "3"]) == 0
    stdout = capsys.readouterr().out
    assert f"wrote {out}" in stdout and "16 images  (2 per class)" in stdout
    assert len(list((out / "train").rglob("*.png"))) == 16
    assert len(list((out / "val").rglob("*.png"))) == 8
    det = tmp_path / "det"
    assert main(["data", "shapes-det", "--out", str(det), "--train", "3", "--val", "0",
                 "--size", "64", "--max-objects", "2"]) == 0
    stdout = capsys.readouterr().out
    written = json.loads((det / "annotations" / "instances_train.json").read_text())
    assert f"{len(written['annotations'])} objects" in stdout and "val        0 images" in stdout


def test_cli_refuses_non_empty_dir_unless_forced(tmp_path, capsys):
    stale = tmp_path / "train" / "circle" / "999999.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    (tmp_path / "notes.txt").write_text("mine")
    args = ["data", "shapes-cls", "--out", str(tmp_path), "--train", "8", "--val", "0",
            "--size", "32"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("irpe data: error:") and "not empty" in err and "--force" in err
    assert main(args + ["--force"]) == 0
    assert not stale.exists() and (tmp_path / "notes.txt").read_text() == "mine"
    assert len(ImageFolder(str(tmp_path / "train"))) == 8
    (tmp_path / "file").write_text("x")
    assert main(["data", "shapes-det", "--out", str(tmp_path / "file")]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--train", "0"], "--train: must be >= 1, got 0"), (["--val", "-1"], "must be >= 0"),
    (["--train", "ten"], "not an integer: 'ten'"), (["--size", "16"], "must be >= 32"),
    (["--seed", "-2"], "must be >= 0"),
])
def test_cli_bad_numbers(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "shapes-cls", "--out", str(tmp_path / "x")] + extra)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_det_needs_bigger_images(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["data", "shapes-det", "--out", str(tmp_path / "x"), "--size", "32"])
    assert "must be >= 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "shapes-det", "--out", str(tmp_path / "x"), "--max-objects", "0"])
    assert not os.path.exists(tmp_path / "x")
