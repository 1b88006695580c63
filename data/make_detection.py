"""Make the cookbook's object-detection set: coloured shapes with boxes, in the COCO 2017 layout.

It stands in for COCO 2017 (no dataset hub here). The output folder has the same layout, so the
notebooks load it exactly as they load COCO (torchvision.datasets.CocoDetection, pycocotools):

    OUT/annotations/instances_train2017.json   OUT/train2017/000000000001.jpg ...
    OUT/annotations/instances_val2017.json     OUT/val2017/000000100001.jpg ...

Each image has 1-4 objects on a noisy background with a colour gradient. An object's class is its
shape (circle, square, triangle, diamond, ring); each class has its own hue (jittered), so a detector
learns it quickly, but it must still find every object and its box. Boxes are tight around the shape;
annotations carry COCO's fields (bbox [x, y, w, h], area, iscrowd, segmentation polygon).

    python data/make_detection.py --out /tmp/shapes --train 512 --val 128 --image-size 128

A fixed seed makes the same files on every machine (the JPEG encoder of one Pillow version).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SEED = 0
CATEGORIES = [  # COCO-style: ids start at 1 (0 is the background for torchvision's detectors)
    {"id": 1, "name": "circle", "supercategory": "shape"},
    {"id": 2, "name": "square", "supercategory": "shape"},
    {"id": 3, "name": "triangle", "supercategory": "shape"},
    {"id": 4, "name": "diamond", "supercategory": "shape"},
    {"id": 5, "name": "ring", "supercategory": "shape"},
]
COLOURS = {1: (220, 40, 40), 2: (40, 170, 60), 3: (40, 80, 220), 4: (230, 200, 30), 5: (200, 50, 200)}
SPLITS = {"train": ("train2017", 1), "val": ("val2017", 100_001)}  # folder, first image id


def _polygon(category: int, x0: float, y0: float, size: float) -> list[tuple[float, float]]:
    """The outline of a shape filling the square box (x0, y0, size, size)."""
    cx, cy, r = x0 + size / 2, y0 + size / 2, size / 2
    if category in (1, 5):  # circle, ring: 24-gon touching the box
        return [(cx + r * math.cos(2 * math.pi * k / 24), cy + r * math.sin(2 * math.pi * k / 24)) for k in range(24)]
    if category == 2:
        return [(x0, y0), (x0 + size, y0), (x0 + size, y0 + size), (x0, y0 + size)]
    if category == 3:
        return [(cx, y0), (x0 + size, y0 + size), (x0, y0 + size)]
    return [(cx, y0), (x0 + size, cy), (cx, y0 + size), (x0, cy)]  # diamond


def _iou(a, b) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    iw = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    ih = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = iw * ih
    return inter / (aw * ah + bw * bh - inter)


def _shoelace(points) -> float:
    xs, ys = np.array(points).T
    return float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2)


def draw_image(rng: np.random.Generator, image_size: int):
    """One image and its objects as (category, [x, y, w, h], polygon, area)."""
    base = rng.integers(70, 190, size=3)
    tilt = rng.integers(-40, 40, size=3)
    ramp = np.linspace(0, 1, image_size)[None, :, None] * tilt
    pixels = base + ramp + rng.normal(0, 6, size=(image_size, image_size, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)

    objects = []
    for _ in range(int(rng.integers(1, 5))):
        for _attempt in range(20):  # place it without covering another object much
            size = float(rng.uniform(0.18, 0.5) * image_size)
            x0, y0 = rng.uniform(0, image_size - size, size=2)
            box = [float(x0), float(y0), size, size]
            if all(_iou(box, other[1]) < 0.1 for other in objects):
                break
        else:
            continue
        category = int(rng.integers(1, len(CATEGORIES) + 1))
        colour = tuple(int(np.clip(c + rng.integers(-25, 26), 0, 255)) for c in COLOURS[category])
        points = _polygon(category, x0, y0, size)
        draw.polygon(points, fill=colour)
        area = _shoelace(points)
        if category == 5:  # ring: punch a hole of the background's colour at the centre
            hole = _polygon(1, x0 + size * 0.3, y0 + size * 0.3, size * 0.4)
            draw.polygon(hole, fill=tuple(int(v) for v in base + tilt * (x0 + size / 2) / image_size))
            area -= _shoelace(hole)
        xs, ys = zip(*points)
        tight = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
        objects.append((category, [round(v, 2) for v in tight], points, area))
    return image, objects


def make(out, train: int = 512, val: int = 128, image_size: int = 128, seed: int = SEED) -> Path:
    """Write the set into `out` (COCO 2017 layout); return `out`. Existing files are overwritten."""
    out = Path(out)
    rng = np.random.default_rng(seed)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    annotation_id = 1
    for split, count in (("train", train), ("val", val)):
        folder, first_id = SPLITS[split]
        (out / folder).mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for image_id in range(first_id, first_id + count):
            image, objects = draw_image(rng, image_size)
            file_name = f"{image_id:012d}.jpg"
            image.save(out / folder / file_name, quality=92)
            images.append({"id": image_id, "file_name": file_name, "width": image_size, "height": image_size})
            for category, bbox, points, area in objects:
                annotations.append({
                    "id": annotation_id, "image_id": image_id, "category_id": category, "bbox": bbox,
                    "area": round(area, 2), "iscrowd": 0,
                    "segmentation": [[round(v, 2) for point in points for v in point]],
                })
                annotation_id += 1
        coco = {
            "info": {"description": "Coloured shapes, a stand-in for COCO 2017 (data/make_detection.py)",
                     "version": "1.0", "year": 2026},
            "licenses": [],
            "images": images,
            "annotations": annotations,
            "categories": CATEGORIES,
        }
        (out / "annotations" / f"instances_{folder}.json").write_text(json.dumps(coco))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write (COCO 2017 layout)")
    parser.add_argument("--train", type=int, default=512, help="training images")
    parser.add_argument("--val", type=int, default=128, help="validation images")
    parser.add_argument("--image-size", type=int, default=128, help="side of the square images, in pixels")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    out = make(args.out, args.train, args.val, args.image_size, args.seed)
    print(f"wrote {args.train} train and {args.val} val images of {args.image_size} px to {out}")


if __name__ == "__main__":
    main()
