"""Make a small 10-class image-folder dataset in Imagenette's layout (an offline stand-in), fixed seed.

    python data/make_image_folders.py OUT [--train-per-class 40] [--val-per-class 10] [--size 64]

writes OUT/train/<class>/*.JPEG and OUT/val/<class>/*.JPEG, the tree that
`torchvision.datasets.ImageFolder` reads and that the real Imagenette (fast.ai's 10-class subset of
ImageNet, https://github.com/fastai/imagenette) unpacks to; the class folders carry Imagenette's WordNet
ids, so code written for one runs on the other. The images are not committed: tests generate them.

Each class is one shape in one colour family (a red disc, a blue square, ...), drawn at a random size,
position and rotation over a noisy textured background, with the hue, brightness and background varied
per image. A CNN learns it in an epoch or two; it cannot be solved by the mean colour alone, because
two classes share each colour family and differ by shape.
"""
from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

# Imagenette's classes (WordNet id, name), in its folder order.
IMAGENETTE_CLASSES = [
    ("n01440764", "tench"),
    ("n02102040", "English springer"),
    ("n02979186", "cassette player"),
    ("n03000684", "chain saw"),
    ("n03028079", "church"),
    ("n03394916", "French horn"),
    ("n03417042", "garbage truck"),
    ("n03425413", "gas pump"),
    ("n03445777", "golf ball"),
    ("n03888605", "parachute"),
]
# What each stand-in class draws: (shape, base RGB colour). Colour families repeat; shapes tell them apart.
CLASS_LOOKS = [
    ("disc", (210, 40, 40)),
    ("square", (210, 40, 40)),
    ("triangle", (40, 80, 210)),
    ("cross", (40, 80, 210)),
    ("ring", (40, 170, 60)),
    ("bar", (40, 170, 60)),
    ("disc", (230, 200, 30)),
    ("triangle", (230, 200, 30)),
    ("square", (150, 50, 190)),
    ("ring", (150, 50, 190)),
]


def _polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if shape == "square":
        corners = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
    elif shape == "triangle":
        corners = [(0, -1.2), (1.1, 0.9), (-1.1, 0.9)]
    elif shape == "cross":
        a, b = 0.35, 1.0
        corners = [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a), (a, b), (-a, b), (-a, a), (-b, a), (-b, -a), (-a, -a)]
    else:  # bar
        corners = [(-1.1, -0.3), (1.1, -0.3), (1.1, 0.3), (-1.1, 0.3)]
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * c - y * s), cy + r * (x * s + y * c)) for x, y in corners]


def draw_image(label: int, size: int, rng: random.Random) -> Image.Image:
    """One image of class `label`: its shape and colour family on a random textured background."""
    shape, base = CLASS_LOOKS[label]
    noise = np.random.default_rng(rng.getrandbits(32))
    background = np.array([rng.randint(60, 200) for _ in range(3)], dtype=np.float32)
    pixels = background + noise.normal(0, 25, (size, size, 3))
    stripes = np.sin(np.arange(size) * rng.uniform(0.2, 0.9) + rng.uniform(0, 6.3)) * rng.uniform(0, 20)
    pixels += stripes[None, :, None] if rng.random() < 0.5 else stripes[:, None, None]
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))

    draw = ImageDraw.Draw(image)
    shade = rng.uniform(0.75, 1.15)
    colour = tuple(int(np.clip(c * shade + rng.randint(-25, 25), 0, 255)) for c in base)
    r = size * rng.uniform(0.18, 0.32)
    cx, cy = (rng.uniform(r + 1, size - r - 1) for _ in range(2))
    if shape == "disc":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=colour, width=max(2, int(r * 0.35)))
    else:
        draw.polygon(_polygon(shape, cx, cy, r, rng.uniform(0, math.pi)), fill=colour)
    if rng.random() < 0.3:
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.0)))
    return image


def make_image_folders(out, train_per_class: int = 40, val_per_class: int = 10, size: int = 64, seed: int = 0) -> Path:
    """Write OUT/{train,val}/<wnid>/<wnid>_<i>.JPEG; return OUT. Same arguments, same bytes."""
    out = Path(out)
    rng = random.Random(seed)
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for label, (wnid, _) in enumerate(IMAGENETTE_CLASSES):
            folder = out / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                draw_image(label, size, rng).save(folder / f"{wnid}_{split}_{i}.JPEG", quality=90)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="folder to write train/ and val/ into")
    parser.add_argument("--train-per-class", type=int, default=40)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (Imagenette: 160, 320 or full)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = make_image_folders(args.out, args.train_per_class, args.val_per_class, args.size, args.seed)
    n = sum(1 for _ in out.glob("*/*/*.JPEG"))
    print(f"{n} images of {args.size}x{args.size} px in 10 classes -> {out}/train, {out}/val")


if __name__ == "__main__":
    main()
