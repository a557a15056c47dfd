#!/usr/bin/env python3
"""The folder bench_data reads: ~2000 JPEGs of real photographs, 300-500 px, quality 90.

Random crops (40-100% of the shorter side, aspect 3:4 to 4:3) of scikit-image's sample
photographs, rescaled so that the longer side is 300-500 px (Lanczos), saved by PIL at
quality 90 (4:2:0), one class folder per source photograph. The greyscale photographs
(camera, coins, moon) are saved as RGB. Seeded: the same folder on every run. Not committed.

Usage: python3 bench/make_bench_images.py OUT_DIR [--count 2000] [--seed 0]
Needs numpy, pillow, scikit-image.
"""
import argparse
import os

import numpy as np
import skimage.data
from PIL import Image

SOURCES = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "retina", "immunohistochemistry",
           "camera", "coins", "moon"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    photos = {name: Image.fromarray(getattr(skimage.data, name)()).convert("RGB") for name in SOURCES}
    for name in SOURCES:
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
    for i in range(args.count):
        name = SOURCES[i % len(SOURCES)]
        photo = photos[name]
        w, h = photo.size
        side = rng.uniform(0.4, 1.0) * min(w, h)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = min(w, int(side * np.sqrt(aspect))), min(h, int(side / np.sqrt(aspect)))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = photo.crop((left, top, left + cw, top + ch))
        long_side = int(rng.integers(300, 501))
        scale = long_side / max(cw, ch)
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        crop.resize(size, Image.LANCZOS).save(os.path.join(args.out, name, f"{i:05d}.jpg"), quality=90)
    print(f"wrote {args.count} JPEGs in {len(SOURCES)} class folders under {args.out}")


if __name__ == "__main__":
    main()
