#!/usr/bin/env python3
"""PyTorch twin of bench/bench_data.cpp: images per second of torchvision's ImageFolder +
torch.utils.data.DataLoader(num_workers) over the same folder with the same two pipelines
(PIL decoding and PIL-path transforms, torchvision's defaults):

  crop  RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet)
  gan   Resize(64) + CenterCrop(64) + ToTensor + Normalize(0.5, 0.5)

A run is one whole epoch (batches of --batch, shuffled), timed from iter(loader) (which
starts the worker processes) to the last batch. With --ours PATH (build/bench/bench_data)
each repeat runs one epoch of ours (a bench_data process with --repeats 1) and one of
torchvision's, alternating which goes first, and a row "ratio" gives ours / torchvision's
median images per second: the same folder, the same run, the same load.
Each row carries "load": the 1-minute load average when it was measured (2 shared cores:
compare rows measured at low load only).

Usage: python3 bench/bench_data_torch.py --root DIR [--pipeline crop|gan|all] [--workers 1,2]
                                         [--batch 64] [--repeats 3] [--ours build/bench/bench_data]
Needs torch and torchvision (pip install --no-deps torchvision beside torch).
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torchvision
from torchvision import transforms as T


def pipeline_transform(name):
    if name == "crop":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                          T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    return T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])


def torch_epoch(dataset, workers, batch, epoch):
    torch.manual_seed(epoch)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers)
    start = time.perf_counter()
    images = sum(images.shape[0] for images, _ in loader)
    assert images == len(dataset), images
    return time.perf_counter() - start


def ours_epoch(binary, root, pipeline, workers, batch):
    out = subprocess.run([binary, "--root", root, "--pipeline", pipeline, "--workers", str(workers), "--batch",
                          str(batch), "--repeats", "1"], check=True, capture_output=True, text=True).stdout
    row = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return row["ms"] / 1e3


def row(pipeline, impl, workers, batch, images, seconds, load):
    median = statistics.median(seconds)
    return {"op": "data_loader", "shape": "crop224" if pipeline == "crop" else "gan64", "dtype": "f32", "impl": impl,
            "ms": round(median * 1e3, 1), "gflops": None, "gbps": None, "baseline": None, "ratio": None,
            "workers": workers, "batch": batch, "images": images, "runs": len(seconds),
            "images_per_s": round(images / median, 1), "images_per_s_min": round(images / max(seconds), 1),
            "images_per_s_max": round(images / min(seconds), 1), "load": round(load, 2)}


def main():
    parser = argparse.ArgumentParser(description="torchvision ImageFolder + DataLoader images per second")
    parser.add_argument("--root", required=True)
    parser.add_argument("--pipeline", default="all", choices=["crop", "gan", "all"])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ours", help="build/bench/bench_data: alternate its epochs with torchvision's")
    args = parser.parse_args()
    rows = []
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {os.cpu_count()} cores", flush=True)
    for pipeline in ["crop", "gan"]:
        if args.pipeline not in ("all", pipeline):
            continue
        dataset = torchvision.datasets.ImageFolder(args.root, pipeline_transform(pipeline))
        for workers in [int(w) for w in args.workers.split(",")]:
            theirs, ours, loads = [], [], []
            for r in range(args.repeats):
                loads.append(os.getloadavg()[0])
                order = ["ours", "torch"] if r % 2 == 0 else ["torch", "ours"]
                for impl in order:
                    if impl == "torch":
                        theirs.append(torch_epoch(dataset, workers, args.batch, r))
                    elif args.ours:
                        ours.append(ours_epoch(args.ours, args.root, pipeline, workers, args.batch))
            n = len(dataset)
            load = statistics.mean(loads)
            rows.append(row(pipeline, "torchvision", workers, args.batch, n, theirs, load))
            line = f"{pipeline:5s} workers {workers}: torchvision {n / statistics.median(theirs):7.1f} img/s"
            if ours:
                ours_row = row(pipeline, "nanoddp", workers, args.batch, n, ours, load)
                ours_row["baseline"] = "torchvision"
                ours_row["ratio"] = round(statistics.median(theirs) / statistics.median(ours), 2)
                rows.append(ours_row)
                line += f", nanoddp {n / statistics.median(ours):7.1f} img/s, ratio {ours_row['ratio']:.2f}"
            print(line + f"  (load {load:.2f})", flush=True)
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
