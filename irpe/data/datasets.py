"""Dataset readers: ImageFolder and COCO detection on disk, and the in-memory shapes sets.

Items are ``(image, label)`` or ``(image, target)``; the image is a PIL image, or whatever the
transform makes of it (a (3, H, W) tensor with :class:`irpe.data.Preprocess`). Detection targets
follow DETR: boxes (cx, cy, w, h) normalised by the original image size, so they stay valid
under any resize of the image.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset

from . import shapes
from .transforms import load_image

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def _check_index(index: int, length: int) -> int:
    """Python-style index into ``length`` items; IndexError ends iteration over the dataset."""
    if not -length <= index < length:
        raise IndexError(f"index {index} out of range for {length} items")
    return index % length


def _apply(transform: Optional[Callable], image: object) -> object:
    return image if transform is None else transform(image)


def _image_files(folder: str) -> List[str]:
    """Image files under ``folder`` (recursive, sorted; hidden folders skipped)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [os.path.join(dirpath, f) for f in sorted(filenames)
                  if f.lower().endswith(IMAGE_EXTENSIONS)]
    return found


class ImageFolder(Dataset):
    """``root/<class>/**/<image>`` -> (image, class index); classes are the sorted dir names."""

    def __init__(self, root: str, transform: Optional[Callable] = None) -> None:
        if not os.path.isdir(root):
            raise ValueError(f"image folder {root!r} does not exist or is not a directory")
        self.root, self.transform = str(root), transform
        self.classes = sorted(e.name for e in os.scandir(root)
                              if e.is_dir() and not e.name.startswith("."))
        if not self.classes:
            raise ValueError(f"image folder {root!r} has no class directories")
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples: List[Tuple[str, int]] = []
        for label, name in enumerate(self.classes):
            files = _image_files(os.path.join(root, name))
            if not files:
                raise ValueError(f"class directory {os.path.join(root, name)!r} has no images "
                                 f"({', '.join(IMAGE_EXTENSIONS)})")
            self.samples += [(path, label) for path in files]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[_check_index(index, len(self))]
        return _apply(self.transform, load_image(path)), label


class ShapesClassification(Dataset):
    """The synthetic shapes classification split, rendered on access (equals the written set)."""

    def __init__(self, num: int, seed: int = 0, size: int = 64,
                 transform: Optional[Callable] = None, split: str = "train") -> None:
        shapes.classification_scene(seed, 0, size, split)  # validates the arguments
        shapes.check_counts(num=num)
        self.num, self.seed, self.size, self.split = num, seed, size, split
        self.transform = transform
        self.classes = list(shapes.SHAPE_CLASSES)

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, index: int):
        index = _check_index(index, self.num)
        image, label = shapes.render_classification(self.seed, index, self.size, self.split)
        return _apply(self.transform, image), label


def detection_target(annotations: Sequence[Dict], width: int, height: int, image_id: int,
                     label_of: Dict[int, int]) -> Dict:
    """DETR target from COCO annotations: normalised cxcywh boxes, contiguous labels.

    Crowd annotations are skipped; boxes are clipped to the image and empty ones dropped.
    """
    boxes, labels = [], []
    for ann in annotations:
        if ann.get("iscrowd", 0):
            continue
        x, y, w, h = (float(v) for v in ann["bbox"])
        x0, y0 = min(max(x, 0.0), width), min(max(y, 0.0), height)
        x1, y1 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
        if x1 <= x0 or y1 <= y0:
            continue
        boxes.append([(x0 + x1) / 2 / width, (y0 + y1) / 2 / height,
                      (x1 - x0) / width, (y1 - y0) / height])
        labels.append(label_of[ann["category_id"]])
    return {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
            "labels": torch.tensor(labels, dtype=torch.int64),
            "image_id": int(image_id),
            "orig_size": torch.tensor([height, width], dtype=torch.int64)}


def check_same_classes(found: Sequence[str], expected: Sequence[str], what: str,
                       expected_what: str, ordered: bool = True) -> None:
    """ValueError unless ``found`` equals ``expected``: names and order (labels are indices),
    or with ``ordered=False`` the same names each once (labels matched by name)."""
    found, expected = list(found), list(expected)
    if found == expected or (not ordered and sorted(found) == sorted(expected)
                             and len(set(found)) == len(found)):
        return
    missing = [c for c in expected if c not in found]
    extra = [c for c in found if c not in expected]
    repeated = sorted({c for c in found if found.count(c) > 1})
    detail = ", ".join(part for part in (missing and f"missing {missing}",
                                         extra and f"extra {extra}",
                                         repeated and f"repeated {repeated}") if part)
    raise ValueError(f"{what} differ from the {expected_what} "
                     f"({detail or 'same names, other order'}): {len(found)} vs "
                     f"{len(expected)} classes")


def _coco_defaults(ann: Dict) -> Dict:
    """Fill the optional COCO fields pycocotools needs: iscrowd 0, area = box w * h."""
    ann.setdefault("iscrowd", 0)
    if "area" not in ann:
        ann["area"] = float(ann["bbox"][2]) * float(ann["bbox"][3])
    return ann


def _read_coco(path: str) -> Dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    missing = [k for k in ("images", "annotations", "categories") if k not in data]
    if missing:
        raise ValueError(f"{path}: not a COCO detection file (missing {', '.join(missing)})")
    return data


class CocoDetection(Dataset):
    """COCO-format detection: ``root/annotations/instances_{split}.json``, ``root/{split}/``."""

    def __init__(self, root: str, split: str = "train",
                 transform: Optional[Callable] = None) -> None:
        ann_path = os.path.join(root, "annotations", f"instances_{split}.json")
        self.image_dir = os.path.join(root, split)
        if not os.path.isfile(ann_path):
            raise ValueError(f"no annotation file {ann_path!r} (COCO layout: "
                             f"root/annotations/instances_{split}.json and root/{split}/)")
        if not os.path.isdir(self.image_dir):
            raise ValueError(f"no image directory {self.image_dir!r} for split {split!r}")
        self.transform, self.ann_path = transform, ann_path
        self._coco = _read_coco(ann_path)
        cats = sorted(self._coco["categories"], key=lambda c: c["id"])
        self.categories = [c["name"] for c in cats]
        self.category_ids = [int(c["id"]) for c in cats]
        self._label_of = {cid: i for i, cid in enumerate(self.category_ids)}
        self.images = sorted(self._coco["images"], key=lambda im: im["id"])
        self._annotations: Dict[int, List[Dict]] = {im["id"]: [] for im in self.images}
        for ann in self._coco["annotations"]:
            if ann.get("image_id") not in self._annotations:
                raise ValueError(f"{ann_path}: annotation {ann.get('id')} refers to unknown "
                                 f"image {ann.get('image_id')!r}")
            if ann.get("category_id") not in self._label_of:
                raise ValueError(f"{ann_path}: annotation {ann.get('id')} has unknown "
                                 f"category {ann.get('category_id')!r}")
            bbox = ann.get("bbox")
            if not (isinstance(bbox, list) and len(bbox) == 4
                    and all(isinstance(v, (int, float)) for v in bbox)):
                raise ValueError(f"{ann_path}: annotation {ann.get('id')} has no bbox "
                                 f"[x, y, w, h] (got {bbox!r})")
            self._annotations[ann["image_id"]].append(_coco_defaults(ann))

    def __len__(self) -> int:
        return len(self.images)

    def coco_json(self) -> Dict:
        """The COCO ground-truth dict as read (pycocotools evaluation)."""
        return self._coco

    def __getitem__(self, index: int):
        info = self.images[_check_index(index, len(self))]
        image = load_image(os.path.join(self.image_dir, info["file_name"]))
        target = detection_target(self._annotations[info["id"]], image.width, image.height,
                                  info["id"], self._label_of)
        return _apply(self.transform, image), target


class ShapesDetection(Dataset):
    """The synthetic shapes detection split in memory; image_id = index + 1 (as on disk)."""

    def __init__(self, num: int, seed: int = 0, size: int = 128, max_objects: int = 5,
                 transform: Optional[Callable] = None, split: str = "train") -> None:
        shapes.detection_scene(seed, 0, size, max_objects, split)  # validates the arguments
        shapes.check_counts(num=num)
        self.num, self.seed, self.size, self.split = num, seed, size, split
        self.max_objects, self.transform = max_objects, transform
        self.categories = list(shapes.SHAPE_CLASSES)
        self.category_ids = [c["id"] for c in shapes.coco_categories()]
        self._label_of = {cid: i for i, cid in enumerate(self.category_ids)}
        self._coco: Optional[Dict] = None

    def __len__(self) -> int:
        return self.num

    def _render(self, index: int):
        return shapes.render_detection(self.seed, index, self.size, self.max_objects, self.split)

    def coco_json(self) -> Dict:
        """COCO ground truth of exactly these images (what write_detection writes for them).

        Built once: evaluation asks for it every epoch and rendering 500 images takes ~1.5 s.
        """
        if self._coco is None:
            records = [(i, i + 1, self._render(i)[1]) for i in range(self.num)]
            self._coco = shapes.coco_ground_truth(records, self.size)
        return self._coco

    def __getitem__(self, index: int):
        index = _check_index(index, self.num)
        image, annotations = self._render(index)
        target = detection_target(annotations, image.width, image.height, index + 1,
                                  self._label_of)
        return _apply(self.transform, image), target


def collate_detection(batch: Sequence[Tuple[torch.Tensor, Dict]]
                      ) -> Tuple[torch.Tensor, torch.Tensor, List[Dict]]:
    """(image, target) items -> zero-padded batch (B, 3, H, W), sizes (B, 2) [h, w], targets."""
    from ..models.detr import pad_images
    if not batch:
        raise ValueError("collate_detection needs at least one item")
    images = [item[0] for item in batch]
    if not all(isinstance(im, torch.Tensor) and im.dim() == 3 for im in images):
        raise ValueError("collate_detection needs (3, H, W) tensor images; give the dataset a "
                         "transform such as irpe.data.Preprocess(task='detection')")
    padded, sizes = pad_images(images)
    return padded, sizes, [item[1] for item in batch]
