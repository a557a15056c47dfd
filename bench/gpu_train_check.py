#!/usr/bin/env python3
"""The GPU check's training runs (issue 21; gpu_check.sh runs this): train_gan and
train_mae (--model tiny) for --steps steps on two devices, CUDA then the CPU by default,
with the same seed, data and flags, and their metrics.jsonl side by side:

- the losses' window means at each logged step on both devices, and the largest relative
  difference |a - b| / max(|b|, 0.05) over the run. The summation orders differ, so the runs
  drift apart; "follows" (at most 0.25) says that a run is not broken (NaN, diverging,
  stuck), not that the two are equal;
- cuda_mallocs (the caching allocator's cudaMalloc calls so far, which the apps log on a
  CUDA device) at the second logged step and at the last: equal means no cudaMalloc in the
  steady state ("steady").

Prints a table and one JSON line per app ({"op": "train_curve", "shape": "<app> <steps>
steps", "impl": "<device a> vs <device b>", ...}). Exit status 0 when every run finished
(the verdicts are in the rows), 1 when one failed (its output's tail is printed).

    python3 bench/gpu_train_check.py BUILD_DIR [--data DIR] [--steps N] [--devices A,B] [--out DIR]

BUILD_DIR holds apps/train_gan and apps/train_mae (a build dir, or gpu_prebuild.sh's
bundle). tests/bench/gpu_train_check_test.py runs it on the CPU twice (--devices cpu,cpu).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

APPS = (("train_gan", []), ("train_mae", ["--model", "tiny"]))
FOLLOW = 0.25  # the largest relative difference of a loss's window means that "follows"


def read_metrics(path):
    """A metrics.jsonl as one dict per logged step, in order (the lines of a step merged:
    train_mae writes its test_loss on a line of its own)."""
    by_step = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                by_step.setdefault(row["step"], {}).update(row)
    return list(by_step.values())


def losses(row):
    """The row's losses: loss, loss_d, loss_g, test_loss, ..."""
    return {k: v for k, v in row.items() if "loss" in k}


def compare(a_rows, b_rows):
    """The largest relative difference of the loss means at the steps both logged, the
    number of such steps, and whether every value is finite."""
    b_by_step = {r["step"]: r for r in b_rows}
    worst, steps, finite = 0.0, 0, True
    for r in a_rows:
        other = b_by_step.get(r["step"])
        if other is None:
            continue
        steps += 1
        for key, value in losses(r).items():
            ref = other.get(key)
            if ref is None:
                continue
            if value != value or ref != ref or abs(value) == float("inf") or abs(ref) == float("inf"):
                finite = False
                continue
            worst = max(worst, abs(value - ref) / max(abs(ref), 0.05))
    return worst, steps, finite


def steady(rows):
    """cuda_mallocs at the second logged step and at the last (None where not logged)."""
    counts = [r.get("cuda_mallocs") for r in rows]
    if len(counts) < 2 or counts[1] is None or counts[-1] is None:
        return None, None
    return counts[1], counts[-1]


def run(exe, device, extra, data, steps, out):
    cmd = [exe, "--device", device, "--steps", str(steps), "--log-every", str(max(steps // 6, 1)),
           "--sample-every", str(steps), "--ckpt-every", str(steps), "--seed", "0", "--data", data,
           "--out", out, "--overwrite", "--no-tensorboard"] + extra  # --out: this script's own folder
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", help="folder with apps/train_gan and apps/train_mae")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--devices", default="cuda,cpu", help="the two devices, compared as A against B")
    ap.add_argument("--out", default=None, help="where the runs write (default: a temporary folder)")
    a = ap.parse_args()
    devices = a.devices.split(",")
    if len(devices) != 2 or a.steps < 2:
        ap.error("--devices takes two devices (A,B), --steps at least 2")
    out = a.out or tempfile.mkdtemp(prefix="gpu_train_check_")
    failed = False
    rows = []
    for app, extra in APPS:
        exe = os.path.join(a.build, "apps", app)
        if not os.access(exe, os.X_OK):
            print("%s: not built (%s)" % (app, exe))
            failed = True
            continue
        metrics = []
        for i, device in enumerate(devices):
            folder = os.path.join(out, "%s_%d_%s" % (app, i, device.replace(":", "")))
            rc, text = run(exe, device, extra, a.data, a.steps, folder)
            if rc != 0:
                print("%s --device %s failed (exit %d):\n%s" % (app, device, rc, text[-2000:]))
                failed = True
                break
            metrics.append(read_metrics(os.path.join(folder, "metrics.jsonl")))
        if len(metrics) < 2:
            continue
        worst, steps, finite = compare(metrics[0], metrics[1])
        first, last = steady(metrics[0])
        rows.append({"op": "train_curve", "shape": "%s %d steps" % (app, a.steps), "dtype": "f32",
                     "impl": "%s vs %s" % tuple(devices), "ms": None, "logged_steps": steps,
                     "max_rel_diff": round(worst, 4), "finite": finite,
                     "follows": finite and steps > 0 and worst <= FOLLOW,
                     "last_losses": [losses(m[-1]) for m in metrics],
                     "cuda_mallocs": [first, last], "steady": None if first is None else first == last})
    print("%-26s %-14s %6s %12s %8s %14s %7s" % ("app", "devices", "logs", "max rel diff", "follows",
                                                "cuda_mallocs", "steady"))
    for r in rows:
        mallocs = "-" if r["cuda_mallocs"][0] is None else "%d -> %d" % tuple(r["cuda_mallocs"])
        print("%-26s %-14s %6d %12.4f %8s %14s %7s" % (r["shape"], r["impl"], r["logged_steps"], r["max_rel_diff"],
                                                      r["follows"], mallocs, "-" if r["steady"] is None else r["steady"]))
    for r in rows:
        print(json.dumps(r, separators=(",", ":")))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
