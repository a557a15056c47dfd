#!/usr/bin/env python3
"""Measured next to estimated: each row of the cost model (impl "model", from
nanoddp_emu_cost_model; committed as bench/cost_model.jsonl) beside the GPU's time for the
same row (bench_kernels' "model" family, impl "cuda::kernels", bench/cost_model_rows.h),
joined on (op, shape, dtype). Pure Python, no GPU, no torch: gpu_check.sh runs it on its
bench_kernels.jsonl.

    python3 bench/model_join.py MODEL.jsonl MEASURED.jsonl --gpu NAME

The model has a set of rows per device ("device": "H200", "H100": the same rows at each
GPU's rates); --gpu NAME is the measured GPU's name (nvidia-smi's, e.g. "NVIDIA H100 80GB
HBM3"), and the rows joined are those of the one device whose name it contains (case
apart), so that each measurement meets the estimate for its own GPU.
Prints, per model row of that device, a JSON line
    {"op","shape","dtype","impl":"measured_vs_model","device","ms","gflops","gbps",
     "baseline":"model","ratio","model_ms","measured_over_model","bound"}
("ms", "gflops", "gbps" measured; "ratio" = model ms / measured ms as every bench row's
baseline ms / our ms, so > 1 means the GPU beat the estimate; "measured_over_model" its
inverse, how many times the estimate the GPU took; both null for a row not measured), then
a table. Measured rows are our own (impl "cuda::..." or "nd::..."), the first of each key;
rows with "ms": null (a note) count as not measured. Exit status 0 (a missing row is a
finding, not an error); 2 for a bad command line, a line that is not JSON, or a GPU name
that matches no device of the model (or more than one).
"""
import argparse
import json
import sys

KEY = ("op", "shape", "dtype")


def read_rows(path):
    """The JSON rows of a file (lines starting with '{'); ValueError naming the line.
    bench_kernels_torch.py --join reads with it too."""
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: expected a JSON object, found {line.strip()[:80]!r} ({e})")
    return rows


def key_of(row):
    return tuple(row.get(k) for k in KEY)


def is_ours(row):
    """A measured row of nanoddp's own: impl "cuda::..." or "nd::..." with a time (the cuDNN,
    cuBLAS, copy, PyTorch and model rows are what ours are compared with; "ms": null is a note).
    bench_kernels_torch.py --join selects with it too."""
    return (row.get("impl") or "").startswith(("cuda::", "nd::")) and bool(row.get("ms"))


def device_for(gpu_name, model_rows):
    """The model's device for a GPU name: the one device name (of the model rows' "device"
    fields) that gpu_name contains, case apart; ValueError naming both otherwise."""
    devices = []
    for m in model_rows:
        if m.get("impl") != "model":
            continue
        if not m.get("device"):
            raise ValueError(f"expected a \"device\" field in every model row, found none in {m.get('op')} "
                             f"{m.get('shape')} (regenerate the model's rows)")
        if m["device"] not in devices:
            devices.append(m["device"])
    found = [d for d in devices if d.lower() in gpu_name.lower()]
    if len(found) != 1:
        raise ValueError(f"expected a GPU name containing exactly one of the model's devices ({', '.join(devices)}), "
                         f"found {gpu_name!r}")
    return found[0]


def join(model_rows, measured_rows, device):
    """One dict per model row of `device`, in the model's order (see the module's docstring)."""
    measured = {}
    for r in measured_rows:
        if is_ours(r) and key_of(r) not in measured:
            measured[key_of(r)] = r
    joined = []
    for m in model_rows:
        if m.get("impl") != "model" or not m.get("ms") or m.get("device") != device:
            continue
        got = measured.get(key_of(m))
        out = {k: m[k] for k in KEY}
        out["impl"] = "measured_vs_model"
        out["device"] = device
        out["ms"] = got["ms"] if got else None
        out["gflops"] = got.get("gflops") if got else None
        out["gbps"] = got.get("gbps") if got else None
        out["baseline"] = "model"
        out["ratio"] = round(m["ms"] / got["ms"], 3) if got else None
        out["model_ms"] = m["ms"]
        out["measured_over_model"] = round(got["ms"] / m["ms"], 3) if got else None
        out["bound"] = m.get("bound")
        joined.append(out)
    return joined


def table(joined, device, gpu_name):
    lines = [f"measured vs model at the {device}'s rates (GPU {gpu_name!r}; joined on op, shape, dtype): "
             f"{sum(r['ms'] is not None for r in joined)} of {len(joined)} model row(s) measured",
             f"{'op':18} {'shape':24} {'dtype':5} {'model us':>9} {'GPU us':>9} {'GPU/model':>12}  model bound"]
    for r in joined:
        gpu = f"{r['ms'] * 1e3:9.2f}" if r["ms"] is not None else f"{'-':>9}"
        over = f"{r['measured_over_model']:12.2f}" if r["ms"] is not None else "not measured"
        lines.append(f"{r['op']:18} {r['shape']:24} {r['dtype']:5} {r['model_ms'] * 1e3:9.2f} {gpu} {over}  "
                     f"{r['bound'] or '-'}")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(prog="model_join.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", metavar="MODEL.jsonl")
    ap.add_argument("measured", metavar="MEASURED.jsonl")
    ap.add_argument("--gpu", required=True, metavar="NAME", help="the measured GPU's name, as nvidia-smi gives it")
    a = ap.parse_args(argv[1:])
    try:
        model_rows = read_rows(a.model)
        device = device_for(a.gpu, model_rows)
        joined = join(model_rows, read_rows(a.measured), device)
    except (OSError, ValueError) as e:
        print(f"model_join.py: {e}", file=sys.stderr)
        return 2
    for r in joined:
        print(json.dumps(r, separators=(",", ":")))
    print()
    print(table(joined, device, a.gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
