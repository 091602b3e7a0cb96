"""Synthetic "shapes" images for demo training: one shape to classify, or several to detect.

Every image is a pure function of (seed, split, index) through
``np.random.default_rng([seed, split_id, index])``: random access, no global state, and the
train/val streams differ. A :class:`Scene` keeps the background and one boolean mask per shape,
so boxes are exact (the tight box of the painted pixels) and tests can check them.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Tuple

import numpy as np

from irpe.atomic import atomic_dir

if TYPE_CHECKING:
    from _typeshed import StrPath
    from PIL import Image
    from tqdm import tqdm

SHAPE_CLASSES: Tuple[str, ...] = ("circle", "cross", "diamond", "hexagon", "ring", "square",
                                  "star", "triangle")
SPLITS: Tuple[str, ...] = ("train", "val", "test")
MIN_SIZE = {"classification": 32, "detection": 64}
CLS_RADIUS = (0.175, 0.40)   # circumradius / image side: the shape spans ~35%-80% of the image
DET_RADIUS = (0.075, 0.20)   # detection: ~15%-40% of the image side
MAX_IOU = 0.05               # detection: placements overlapping an earlier box more are redrawn
PLACEMENT_TRIES = 30
MIN_CONTRAST = 80.0          # luminance difference between a shape and the background's base
BACKGROUND_SPREAD = 20       # max per-channel deviation of gradient/noise from the base colour


def _regular(n: int, start_deg: float = -90.0) -> np.ndarray:
    angles = np.deg2rad(start_deg + 360.0 * np.arange(n) / n)
    return np.stack([np.cos(angles), np.sin(angles)], axis=1)


def _star(points: int = 5, inner: float = 0.45) -> np.ndarray:
    outline = _regular(2 * points)
    outline[1::2] *= inner
    return outline


def _cross(half_width: float = 0.32) -> np.ndarray:
    a = half_width
    quarter = [(a, 1), (a, a), (1, a)]  # top-right corner of the plus; then turn by -90 deg
    pts = []
    for k in range(4):
        c, s = math.cos(-k * math.pi / 2), math.sin(-k * math.pi / 2)
        pts += [(x * c - y * s, x * s + y * c) for x, y in quarter]
    outline = np.asarray(pts, dtype=np.float64)
    return outline / np.hypot(outline[:, 0], outline[:, 1]).max()


# unit outlines (circumradius 1, y down) and how far each class may be rotated, in degrees:
# (low, high) of a uniform draw; square/diamond stay near 0/45 so they never look alike
_OUTLINES = {
    "circle": _regular(48), "cross": _cross(), "diamond": _regular(4, 0.0),
    "hexagon": _regular(6), "ring": _regular(48), "square": _regular(4, 45.0),
    "star": _star(), "triangle": _regular(3),
}
_ROTATION = {"circle": (0, 0), "cross": (0, 90), "diamond": (-8, 8), "hexagon": (0, 60),
             "ring": (0, 0), "square": (-12, 12), "star": (0, 72), "triangle": (0, 120)}
_RING_HOLE = (0.45, 0.6)  # inner / outer radius of a ring


@dataclass
class Shape:
    """One painted shape: class index, pixel mask (H, W) bool and RGB colour."""

    label: int
    mask: np.ndarray
    colour: np.ndarray

    def box(self) -> List[float]:
        """Tight COCO box [x, y, w, h] of the mask in pixels (pixel edges, not centres)."""
        rows, cols = np.flatnonzero(self.mask.any(1)), np.flatnonzero(self.mask.any(0))
        x0, y0 = float(cols[0]), float(rows[0])
        return [x0, y0, float(cols[-1] + 1) - x0, float(rows[-1] + 1) - y0]


@dataclass
class Scene:
    """A background (H, W, 3) uint8 and the shapes painted on it, in painting order."""

    background: np.ndarray
    shapes: List[Shape]

    def image(self) -> "Image.Image":
        """The RGB PIL image: the background with every shape's mask filled with its colour."""
        from PIL import Image
        pixels = self.background.copy()
        for shape in self.shapes:
            pixels[shape.mask] = shape.colour
        return Image.fromarray(pixels, "RGB")

    def annotations(self) -> List[Dict]:
        """COCO-style dicts (bbox, 1-based category_id, area = w*h) of the shapes."""
        out = []
        for shape in self.shapes:
            x, y, w, h = shape.box()
            out.append({"bbox": [x, y, w, h], "category_id": shape.label + 1, "area": w * h})
        return out


def make_rng(seed: int, index: int, split: str) -> np.random.Generator:
    """The generator of one image: ``default_rng([seed, split_id, index])``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for name, value in (("seed", seed), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return np.random.default_rng([int(seed), SPLITS.index(split), int(index)])


def check_size(size: int, task: str) -> None:
    """Refuse image sides too small for every class to stay recognisable."""
    low = MIN_SIZE[task]
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < low:
        raise ValueError(f"{task} image size must be an integer >= {low}, got {size!r}")


def shape_mask(label: int, cx: float, cy: float, radius: float, angle: float, size: int,
               hole: float = 0.0) -> np.ndarray:
    """Rasterise class ``label`` (centre, circumradius, degrees) into a (size, size) bool mask."""
    from PIL import Image, ImageDraw
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    theta = math.radians(angle)
    rot = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    outline = _OUTLINES[SHAPE_CLASSES[label]] @ rot.T
    draw.polygon([(cx + x * radius, cy + y * radius) for x, y in outline], fill=1)
    if hole > 0:
        draw.polygon([(cx + x * radius * hole, cy + y * radius * hole) for x, y in outline],
                     fill=0)
    return np.asarray(canvas, dtype=bool)


def _luminance(rgb: np.ndarray) -> float:
    return float(np.dot(rgb, (0.299, 0.587, 0.114)))


def _background(rng: np.random.Generator, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """(size, size, 3) uint8 background (solid, mild gradient or mild noise) and its base."""
    base = rng.integers(0, 256, 3).astype(np.float64)
    kind = rng.integers(3)
    if kind == 0:
        offset = np.zeros((size, size, 1))
    elif kind == 1:
        theta = rng.uniform(0, 2 * math.pi)
        ys, xs = np.mgrid[0:size, 0:size] / max(size - 1, 1) * 2 - 1
        ramp = (xs * math.cos(theta) + ys * math.sin(theta)) / math.sqrt(2)
        offset = (ramp * rng.uniform(0.4, 1.0) * BACKGROUND_SPREAD)[..., None]
    else:
        noise = rng.normal(0.0, rng.uniform(2.0, 6.0), (size, size, 3))
        offset = np.clip(noise, -BACKGROUND_SPREAD, BACKGROUND_SPREAD)
    pixels = np.clip(np.rint(base + offset), 0, 255).astype(np.uint8)
    return pixels, base


def _contrasting(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
    """A random colour whose luminance differs from ``base`` by >= MIN_CONTRAST."""
    target = _luminance(base)
    for _ in range(16):
        colour = rng.integers(0, 256, 3)
        if abs(_luminance(colour) - target) >= MIN_CONTRAST:
            return colour.astype(np.uint8)
    return np.full(3, 0 if target > 127.5 else 255, np.uint8)


def _draw_shape(rng: np.random.Generator, label: int, size: int,
                radius_frac: Tuple[float, float]) -> np.ndarray:
    """Mask of class ``label`` at a random size, rotation and position fully inside."""
    radius = rng.uniform(*radius_frac) * size
    cx, cy = rng.uniform(radius, size - radius, 2)
    angle = rng.uniform(*_ROTATION[SHAPE_CLASSES[label]])
    hole = rng.uniform(*_RING_HOLE) if SHAPE_CLASSES[label] == "ring" else 0.0
    return shape_mask(label, cx, cy, radius, angle, size, hole)


def classification_scene(seed: int, index: int, size: int = 64, split: str = "train") -> Scene:
    """Scene of one classification image: one shape of class ``index % 8``."""
    check_size(size, "classification")
    rng = make_rng(seed, index, split)
    background, base = _background(rng, size)
    label = index % len(SHAPE_CLASSES)
    mask = _draw_shape(rng, label, size, CLS_RADIUS)
    return Scene(background, [Shape(label, mask, _contrasting(rng, base))])


def render_classification(seed: int, index: int, size: int = 64,
                          split: str = "train") -> Tuple["Image.Image", int]:
    """One RGB image with one shape and its label (index into SHAPE_CLASSES); deterministic."""
    scene = classification_scene(seed, index, size, split)
    return scene.image(), scene.shapes[0].label


def box_iou_xywh(a: List[float], b: List[float]) -> float:
    """IoU of two [x, y, w, h] boxes."""
    iw = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    ih = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
    inter = max(iw, 0.0) * max(ih, 0.0)
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def _place(rng: np.random.Generator, size: int, boxes: List[List[float]],
           occupied: np.ndarray) -> Optional[Shape]:
    """A shape whose box overlaps no earlier box by IoU > MAX_IOU and whose pixels are free."""
    label = int(rng.integers(len(SHAPE_CLASSES)))
    for _ in range(PLACEMENT_TRIES):
        shape = Shape(label, _draw_shape(rng, label, size, DET_RADIUS), np.zeros(3, np.uint8))
        if not shape.mask.any() or (shape.mask & occupied).any():
            continue
        box = shape.box()
        if all(box_iou_xywh(box, other) <= MAX_IOU for other in boxes):
            return shape
    return None


def detection_scene(seed: int, index: int, size: int = 128, max_objects: int = 5,
                    split: str = "train") -> Scene:
    """Scene of one detection image: 1..max_objects shapes with little overlap."""
    check_size(size, "detection")
    if isinstance(max_objects, bool) or not isinstance(max_objects, int) or max_objects < 1:
        raise ValueError(f"max_objects must be an integer >= 1, got {max_objects!r}")
    rng = make_rng(seed, index, split)
    background, base = _background(rng, size)
    shapes: List[Shape] = []
    boxes: List[List[float]] = []
    occupied = np.zeros((size, size), dtype=bool)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        shape = _place(rng, size, boxes, occupied)
        if shape is None:
            continue  # crowded image: keep the shapes placed so far
        shape.colour = _contrasting(rng, base)
        occupied |= shape.mask
        shapes.append(shape)
        boxes.append(shape.box())
    return Scene(background, shapes)


def render_detection(seed: int, index: int, size: int = 128, max_objects: int = 5,
                     split: str = "train") -> Tuple["Image.Image", List[Dict]]:
    """One RGB image with 1..max_objects shapes and their COCO-style annotations."""
    scene = detection_scene(seed, index, size, max_objects, split)
    return scene.image(), scene.annotations()


def coco_categories() -> List[Dict]:
    """COCO ``categories`` of the shapes set: ids 1..8 in SHAPE_CLASSES order."""
    return [{"id": i + 1, "name": name, "supercategory": "shape"}
            for i, name in enumerate(SHAPE_CLASSES)]


def coco_ground_truth(images: List[Tuple[int, int, List[Dict]]], size: int) -> Dict:
    """COCO detection dict from (index, image_id, annotations) of square ``size`` images."""
    out: Dict[str, Any] = {"info": {"description": "irpe synthetic shapes"}, "licenses": [],
                           "images": [], "annotations": [], "categories": coco_categories()}
    for index, image_id, boxes in images:
        out["images"].append({"id": image_id, "file_name": f"{index:06d}.png",
                              "width": size, "height": size})
        for ann in boxes:
            out["annotations"].append({"id": len(out["annotations"]) + 1, "image_id": image_id,
                                       "iscrowd": 0, **ann})
    return out


def check_counts(**counts: int) -> None:
    """Refuse image counts that are not non-negative integers (ValueError naming the argument)."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _progress(total: int, enabled: bool, desc: str) -> tqdm[NoReturn]:
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="img", disable=not enabled, leave=False)


def _write_json(path: StrPath, data: Dict) -> None:
    with open(path, "w", encoding="utf-8") as f:  # inside a staging folder (atomic_dir)
        json.dump(data, f)


def write_classification(out_dir: StrPath, num_train: int = 4000,
                         num_val: int = 1000, seed: int = 0, size: int = 64,
                         progress: bool = False) -> Dict:
    """Write ``out_dir/{train,val}/<class>/<index:06d>.png`` (ImageFolder layout); summary.

    The set is written into a staging folder beside ``out_dir`` and moved in when complete
    (irpe.atomic.atomic_dir: its train/, val/ and shapes.json replace those of ``out_dir``)."""
    check_counts(num_train=num_train, num_val=num_val)
    check_size(size, "classification")
    make_rng(seed, 0, "train")
    root = Path(out_dir)
    summary: Dict[str, Any] = {"task": "classification", "path": str(root), "seed": seed,
                               "size": size, "classes": list(SHAPE_CLASSES), "splits": {}}
    with atomic_dir(root, merge=True) as stage, \
            _progress(num_train + num_val, progress, "shapes-cls") as bar:
        for split, num in (("train", num_train), ("val", num_val)):
            per_class = dict.fromkeys(SHAPE_CLASSES, 0)
            for name in SHAPE_CLASSES:
                (stage / split / name).mkdir(parents=True, exist_ok=True)
            for index in range(num):
                image, label = render_classification(seed, index, size, split)
                image.save(stage / split / SHAPE_CLASSES[label] / f"{index:06d}.png")
                per_class[SHAPE_CLASSES[label]] += 1
                bar.update()
            summary["splits"][split] = {"images": num, "per_class": per_class}
        _write_json(stage / "shapes.json", summary)
    return summary


def write_detection(out_dir: StrPath, num_train: int = 4000, num_val: int = 500,
                    seed: int = 0, size: int = 128, max_objects: int = 5,
                    progress: bool = False) -> Dict:
    """Write ``out_dir/{train,val}/<index:06d>.png`` and COCO json under annotations/; summary.

    Staged beside ``out_dir`` and moved in when complete, as :func:`write_classification`."""
    check_counts(num_train=num_train, num_val=num_val)
    detection_scene(seed, 0, size, max_objects)  # validates every argument before writing
    root = Path(out_dir)
    summary: Dict[str, Any] = {"task": "detection", "path": str(root), "seed": seed,
                               "size": size, "max_objects": max_objects,
                               "classes": list(SHAPE_CLASSES), "splits": {}}
    with atomic_dir(root, merge=True) as stage, \
            _progress(num_train + num_val, progress, "shapes-det") as bar:
        (stage / "annotations").mkdir()
        for split, num in (("train", num_train), ("val", num_val)):
            (stage / split).mkdir(parents=True, exist_ok=True)
            records = []
            for index in range(num):
                image, boxes = render_detection(seed, index, size, max_objects, split)
                image.save(stage / split / f"{index:06d}.png")
                records.append((index, index + 1, boxes))
                bar.update()
            coco = coco_ground_truth(records, size)
            ann_path = root / "annotations" / f"instances_{split}.json"
            _write_json(stage / "annotations" / ann_path.name, coco)
            per_class = dict.fromkeys(SHAPE_CLASSES, 0)
            for ann in coco["annotations"]:
                per_class[SHAPE_CLASSES[ann["category_id"] - 1]] += 1
            summary["splits"][split] = {"images": num, "objects": len(coco["annotations"]),
                                        "per_class": per_class, "annotations": str(ann_path)}
        _write_json(stage / "shapes.json", summary)
    return summary
