#!/usr/bin/env python3
"""Tar shards in WebDataset's layout holding the images of an ImageFolder tree (bench_data --shards).

The folder's samples in torchvision's order (sorted classes, sorted files), shuffled with a
seed (shards are written pre-shuffled, as WebDataset advises), then cut into --shards tar
files OUT/train-{000000..N-1}.tar: sample i is `<i:08d>.jpg` (the file's bytes, unchanged)
and `<i:08d>.cls` (its class index as decimal text). Written with Python's tarfile.

Usage: python3 bench/make_bench_shards.py FOLDER OUT_DIR [--shards 8] [--seed 0]
Prints the shard pattern to give bench_data --shards.
"""
import argparse
import io
import os
import random
import tarfile


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    classes = sorted(d.name for d in os.scandir(args.folder) if d.is_dir())
    samples = []
    for index, name in enumerate(classes):
        for root, _, files in sorted(os.walk(os.path.join(args.folder, name))):
            samples += [(os.path.join(root, f), index) for f in sorted(files)
                        if f.lower().endswith((".jpg", ".jpeg", ".png"))]
    random.Random(args.seed).shuffle(samples)
    os.makedirs(args.out, exist_ok=True)
    width = 6
    for s in range(args.shards):
        with tarfile.open(os.path.join(args.out, f"train-{s:0{width}d}.tar"), "w") as tar:
            for i in range(s, len(samples), args.shards):
                path, label = samples[i]
                ext = os.path.splitext(path)[1].lower().lstrip(".")
                image = open(path, "rb").read()
                for member, data in ((f"{i:08d}.{ext}", image), (f"{i:08d}.cls", str(label).encode())):
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    print(os.path.join(args.out, f"train-{{{0:0{width}d}..{args.shards - 1:0{width}d}}}.tar"))


if __name__ == "__main__":
    main()
