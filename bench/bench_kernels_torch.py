#!/usr/bin/env python3
"""PyTorch side of bench_kernels: the same ops at the same shapes on a CUDA GPU, timed the
same way, so the two outputs join on (op, shape, dtype).

Rows (shapes as in bench/bench_kernels.cpp -- keep the two lists in step):
  conv2d / conv_transpose2d fwd, dgrad, wgrad   F.conv2d / F.conv_transpose2d and autograd,
                                                cudnn.benchmark on, TF32 off (f32 like ours);
                                                again as dtype "bf16": the forward under
                                                torch.autocast(bf16) on the same f32 tensors
                                                (the backward outside it, as in training)
  batch_norm_fwd_bwd, layer_norm_fwd_bwd        F.batch_norm (training) / F.layer_norm + backward
  adamw_step                                    torch.optim.AdamW(fused=True)
  attention_fwd, attention_fwd_bwd              F.scaled_dot_product_attention in f32 (backend
                                                PyTorch picks) and in bf16 and f16 on the flash backend
  matmul, copy                                  torch.mm (TF32 off), Tensor.copy_ of 1 GiB
GFLOP/s and GB/s count the same FLOPs and bytes as bench_kernels.cpp (see its header).
Timing: after two warm-up runs, each sample is back-to-back runs (about 1 ms) between two
CUDA events on the current stream; a row is the median of 3..30 samples. Backward passes
replay a retained graph with the leaves' .grad cleared first, as ours do.
Output: one JSON line per row as measured
  {"op","shape","dtype","impl":"pytorch","ms","gflops","gbps","baseline":null,"ratio":null}
(+ "note" when the row failed), then a table. Without torch or a CUDA GPU: one SKIPPED line,
exit 0.

Usage: python3 bench/bench_kernels_torch.py [--dtype D[,D...]] [--shape REGEX] [NAME...]
       python3 bench/bench_kernels_torch.py --join ROWS.jsonl
NAME, --dtype and --shape as in bench_kernels (default all): --dtype keeps rows of these
dtypes (f32, bf16, f16), --shape rows whose shape string holds a match of REGEX (re.search;
the patterns gpu_check.sh gives mean the same to std::regex). A row left out is not
prepared. Names and flags are checked before torch is imported: a bad one exits 2.
--join (needs no torch, no GPU): ROWS.jsonl holds both programs' JSON lines (gpu_check.sh's
bench_kernels.jsonl). Each of our measured rows (impl "nd::..." or "cuda::...", once per impl)
that has a measured PyTorch row of the same (op, shape, dtype) is printed again as a JSON
line with "baseline":"pytorch" and "ratio" = PyTorch ms / our ms (> 1: ours is faster),
then as a table that marks the issues' targets (21, 26): attention_fwd >= 1.0 and
attention_fwd_bwd >= 0.9 of PyTorch's flash SDPA in bf16, for the bf16 kernels (impl
"cuda::sdpa_bf16").
"""
import argparse
import contextlib
import json
import math
import re
import statistics
import sys

DEVICE = "cuda"
SAMPLE_MS, COMPARE_MS, MIN_SAMPLES, MAX_SAMPLES, MAX_REPS = 1.0, 250.0, 3, 30, 200

# (N, C_in, C_out, HW, k, s, p): DCGAN D at batch 64 and 256, then ResNet 3x3 layers.
CONV2D = [(n, *layer) for n in (64, 256)
          for layer in ((1, 64, 28, 4, 2, 1), (64, 128, 14, 4, 2, 1), (128, 1, 7, 7, 1, 0))] + [
    (32, 64, 64, 56, 3, 1, 1), (32, 128, 128, 28, 3, 1, 1), (32, 256, 256, 14, 3, 1, 1)]
# DCGAN G (nz 100, ngf 64): ConvTranspose2d layers on their inputs.
CONV_TRANSPOSE2D = [(n, *layer) for n in (64, 256)
                    for layer in ((100, 128, 1, 7, 1, 0), (128, 64, 7, 4, 2, 1), (64, 1, 14, 4, 2, 1))]
BATCH_NORM = [(256, 64, 14), (64, 128, 7), (256, 128, 7), (32, 64, 56)]  # N, C, HW
LAYER_NORM_ROWS = [10240, 102400]  # x [rows, 1024]
ADAMW = [10_000_000, 100_000_000]
# B, H, S, D: head dims 64 and 128 at S = 512 to 4096 (issue 21), then the MAE small's
# encoder and decoder attention.
ATTENTION = [(8, 8, 1024, 64), (8, 16, 512, 128), (2, 16, 4096, 64), (2, 16, 4096, 128), (128, 6, 13, 32),
             (128, 3, 50, 32)]
MATMUL = [(2048, 2048, 2048), (4096, 4096, 4096), (1664, 768, 192), (6400, 96, 384)]  # M, N, K


def conv_geom(layer, transposed):
    """FLOPs and bytes of the forward conv behind a layer (a transposed conv is that conv's dgrad)."""
    n, c_in, c_out, hw, k, s, p = layer
    if transposed:
        cx, h, cy = c_out, (hw - 1) * s - 2 * p + k, c_in
    else:
        cx, h, cy = c_in, hw, c_out
    o = (h + 2 * p - k) // s + 1
    return 2.0 * n * cy * o * o * cx * k * k, 4.0 * (n * cx * h * h + n * cy * o * o + cy * cx * k * k)


class Bench:
    def __init__(self, torch, keeps=lambda shape, dtype: True):
        self.torch = torch
        self.keeps = keeps  # (shape, dtype) -> whether the row runs (--dtype, --shape)
        self.rows = []

    def time_ms(self, fn, reps):
        torch = self.torch
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    def row(self, op, shape, dtype, flops, nbytes, prepare):
        """prepare() builds the inputs (and the graph) and returns the closure to time."""
        if not self.keeps(shape, dtype):
            return
        r = {"op": op, "shape": shape, "dtype": dtype, "impl": "pytorch", "ms": None, "gflops": None,
             "gbps": None, "baseline": None, "ratio": None}
        try:
            fn = prepare()
            fn()
            fn()
            first = self.time_ms(fn, 1)
            reps = min(max(math.ceil(SAMPLE_MS / max(first, 1e-4)), 1), MAX_REPS)
            samples = min(max(int(COMPARE_MS / max(reps * first, 1e-3)), MIN_SAMPLES), MAX_SAMPLES)
            ms = statistics.median(self.time_ms(fn, reps) / reps for _ in range(samples))
            r["ms"] = round(ms, 5)
            r["gflops"] = round(flops / (ms * 1e6), 2) if flops else None
            r["gbps"] = round(nbytes / (ms * 1e6), 2) if nbytes else None
        except Exception as e:  # a row that cannot run is reported, the others go on
            r["note"] = f"error: {type(e).__name__}: {e}".replace("\n", " ")[:400]
        self.rows.append(r)
        print(json.dumps(r, separators=(",", ":")), flush=True)

    def table(self):
        print(f"\n{'op':24} {'shape':28} {'dtype':5} {'impl':8} {'ms':>9} {'GFLOP/s':>9} {'GB/s':>8}")
        for r in self.rows:
            head = f"{r['op']:24} {r['shape']:28} {r['dtype']:5} {r['impl']:8} "
            if r["ms"] is None:
                print(head + r["note"][:160])
            else:
                print(head + f"{r['ms']:9.4f} {r['gflops'] or 0:9.1f} {r['gbps'] or 0:8.1f}")


def randn(torch, *shape, requires_grad=False, dtype=None):
    return torch.randn(*shape, device=DEVICE, dtype=dtype or torch.float32, requires_grad=requires_grad)


def backward_replay(out, grad, leaves):
    def run():
        for t in leaves:
            t.grad = None
        out.backward(grad, retain_graph=True)
    return run


def forward_backward(forward, grad, leaves):
    def run():
        for t in leaves:
            t.grad = None
        forward().backward(grad)
    return run


def bench_conv(b, layers, transposed):
    """Every layer and pass in f32, then under autocast (bench_kernels' order)."""
    torch, F = b.torch, b.torch.nn.functional
    for dtype_name in ("f32", "bf16"):
        for layer in layers:
            n, c_in, c_out, hw, k, s, p = layer
            flops, nbytes = conv_geom(layer, transposed)
            shape = f"N={n} {c_in}->{c_out} k{k} s{s} p{p} {hw}x{hw}"
            w_shape = (c_in, c_out, k, k) if transposed else (c_out, c_in, k, k)
            conv = F.conv_transpose2d if transposed else F.conv2d

            def forward(x, w, s=s, p=p, conv=conv, amp=dtype_name == "bf16"):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                    return conv(x, w, None, s, p)

            for pass_ in ("fwd", "dgrad", "wgrad"):
                def prepare(pass_=pass_, n=n, c_in=c_in, hw=hw, w_shape=w_shape, forward=forward):
                    x = randn(torch, n, c_in, hw, hw, requires_grad=pass_ == "dgrad")
                    w = randn(torch, *w_shape, requires_grad=pass_ == "wgrad")
                    if pass_ == "fwd":
                        return lambda: forward(x, w)
                    y = forward(x, w)
                    return backward_replay(y, torch.randn_like(y), [x if pass_ == "dgrad" else w])
                b.row(("conv_transpose2d_" if transposed else "conv2d_") + pass_, shape, dtype_name, flops, nbytes,
                      prepare)


def bench_conv2d(b):
    bench_conv(b, CONV2D, transposed=False)


def bench_conv_transpose2d(b):
    bench_conv(b, CONV_TRANSPOSE2D, transposed=True)


def bench_batch_norm(b):
    torch, F = b.torch, b.torch.nn.functional
    for n, c, hw in BATCH_NORM:
        def prepare(n=n, c=c, hw=hw):
            x = randn(torch, n, c, hw, hw, requires_grad=True)
            w = torch.ones(c, device=DEVICE, requires_grad=True)
            bias = torch.zeros(c, device=DEVICE, requires_grad=True)
            rm, rv = torch.zeros(c, device=DEVICE), torch.ones(c, device=DEVICE)
            return forward_backward(lambda: F.batch_norm(x, rm, rv, w, bias, True, 0.1, 1e-5),
                                    torch.randn_like(x), [x, w, bias])
        b.row("batch_norm_fwd_bwd", f"N={n} C={c} {hw}x{hw}", "f32", 0, 8.0 * 4 * n * c * hw * hw, prepare)


def bench_layer_norm(b):
    torch, F = b.torch, b.torch.nn.functional
    d = 1024
    for rows in LAYER_NORM_ROWS:
        def prepare(rows=rows):
            x = randn(torch, rows, d, requires_grad=True)
            w = torch.ones(d, device=DEVICE, requires_grad=True)
            bias = torch.zeros(d, device=DEVICE, requires_grad=True)
            return forward_backward(lambda: F.layer_norm(x, (d,), w, bias), torch.randn_like(x), [x, w, bias])
        b.row("layer_norm_fwd_bwd", f"[{rows}, {d}]", "f32", 0, 5.0 * 4 * rows * d, prepare)


def bench_adamw(b):
    torch = b.torch
    for n in ADAMW:
        def prepare(n=n):
            p = torch.full((n,), 0.5, device=DEVICE, requires_grad=True)
            p.grad = torch.full_like(p, 1e-2)
            opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
            return opt.step
        b.row("adamw_step", f"params={n}", "f32", 0, 7.0 * 4 * n, prepare)


def flash_backend(torch):
    """A context manager that restricts SDPA to the flash kernel (new and old PyTorch APIs)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        return lambda: torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                                      enable_mem_efficient=False)


def bench_attention(b):
    torch, F = b.torch, b.torch.nn.functional
    sdpa = F.scaled_dot_product_attention
    for bsz, h, s, d in ATTENTION:
        dims, shape = (bsz, h, s, d), f"B={bsz} H={h} S={s} D={d}"
        fwd = 4.0 * bsz * h * s * s * d
        for dtype_name, dtype, backend in (("f32", torch.float32, contextlib.nullcontext),
                                           ("bf16", torch.bfloat16, flash_backend(torch)),
                                           ("f16", torch.float16, flash_backend(torch))):
            tensor_bytes = bsz * h * s * d * (4 if dtype is torch.float32 else 2)

            def prepare_fwd(dtype=dtype, dims=dims):
                q, k, v = (randn(torch, *dims, dtype=dtype) for _ in range(3))
                return lambda: sdpa(q, k, v)

            def prepare_fwd_bwd(dtype=dtype, dims=dims):
                q, k, v = (randn(torch, *dims, dtype=dtype, requires_grad=True) for _ in range(3))
                return forward_backward(lambda: sdpa(q, k, v), randn(torch, *dims, dtype=dtype), [q, k, v])

            with backend():  # the whole row, warm-up included, on that backend
                b.row("attention_fwd", shape, dtype_name, fwd, 4 * tensor_bytes, prepare_fwd)
                b.row("attention_fwd_bwd", shape, dtype_name, 3.5 * fwd, 12 * tensor_bytes, prepare_fwd_bwd)


def bench_matmul(b):
    torch = b.torch
    for m, n, k in MATMUL:
        def prepare(m=m, n=n, k=k):
            x, y = randn(torch, m, k), randn(torch, k, n)
            return lambda: torch.mm(x, y)
        b.row("matmul", f"M={m} N={n} K={k}", "f32", 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n), prepare)


def bench_copy(b):
    torch = b.torch
    n = 1 << 28  # f32 elements in 1 GiB

    def prepare():
        src, dst = torch.empty(n, device=DEVICE), torch.empty(n, device=DEVICE)
        return lambda: dst.copy_(src)
    b.row("copy", "1 GiB", "f32", 0, 2.0 * 4 * n, prepare)


FAMILIES = {  # in run order, as bench_kernels'
    "attention": bench_attention, "copy": bench_copy, "matmul": bench_matmul, "conv2d": bench_conv2d,
    "conv_transpose2d": bench_conv_transpose2d, "batch_norm": bench_batch_norm,
    "layer_norm": bench_layer_norm, "adamw": bench_adamw,
}


# The targets vs PyTorch: (op, dtype, our impl) -> ratio >= target.
JOIN_TARGETS = {("attention_fwd", "bf16", "cuda::sdpa_bf16"): 1.0,
                ("attention_fwd_bwd", "bf16", "cuda::sdpa_bf16"): 0.9}


def join(path):
    """Our rows against PyTorch's of the same (op, shape, dtype): JSON lines, then a table.
    Reads and picks our rows as model_join.py does (read_rows, is_ours; same folder)."""
    from model_join import is_ours, key_of, read_rows
    try:
        rows = read_rows(path)
    except (OSError, ValueError) as e:
        print(f"bench_kernels_torch.py --join: {e}", file=sys.stderr)
        return 2
    torch_ms = {key_of(r): r["ms"] for r in rows if r.get("impl") == "pytorch" and r.get("ms")}
    joined, seen = [], set()
    for r in rows:
        key = key_of(r)
        # once per impl (bench_kernels prints ours once per baseline)
        if not is_ours(r) or key not in torch_ms or key + (r["impl"],) in seen:
            continue
        seen.add(key + (r["impl"],))
        out = dict(r, baseline="pytorch", ratio=round(torch_ms[key] / r["ms"], 3))
        out.pop("note", None)
        joined.append(out)
        print(json.dumps(out, separators=(",", ":")), flush=True)
    print(f"\nours vs PyTorch (ratio = PyTorch ms / our ms), {len(joined)} row(s) joined on (op, shape, dtype)")
    print(f"{'op':24} {'shape':28} {'dtype':5} {'impl':16} {'ms':>9} {'pytorch':>9} {'ratio':>6}")
    for r in joined:
        target = JOIN_TARGETS.get((r["op"], r["dtype"], r["impl"]), 0)
        verdict = f" below the target {target:.2f}" if r["ratio"] < target else ""
        print(f"{r['op']:24} {r['shape']:28} {r['dtype']:5} {r['impl']:16} {r['ms']:9.4f} "
              f"{torch_ms[(r['op'], r['shape'], r['dtype'])]:9.4f} {r['ratio']:6.2f}{verdict}")
    return 0


DTYPES = ("f32", "bf16", "f16")


def dtype_list(text):
    """--dtype's value: a comma-separated list of DTYPES."""
    for d in text.split(","):
        if d not in DTYPES:
            raise argparse.ArgumentTypeError(f"expected {', '.join(DTYPES)} (comma-separated), found {d!r} in {text!r}")
    return text.split(",")


def shape_regex(text):
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"expected a regular expression, found {text!r} ({e})")


def family_name(text):
    if text not in FAMILIES:
        raise argparse.ArgumentTypeError(f"expected a benchmark name ({' '.join(FAMILIES)}), found {text!r}")
    return text


def parse(argv):
    """The command line (exit 2 with a message for a bad name or flag)."""
    ap = argparse.ArgumentParser(prog="bench_kernels_torch.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", type=family_name, metavar="NAME", help=" ".join(FAMILIES))
    ap.add_argument("--dtype", type=dtype_list, help="rows of these dtypes only: f32,bf16,f16")
    ap.add_argument("--shape", type=shape_regex, help="rows whose shape matches REGEX (re.search)")
    ap.add_argument("--join", metavar="ROWS.jsonl", help="ours vs PyTorch from both programs' rows (no torch)")
    return ap.parse_args(argv[1:])


def keeps(args, shape, dtype):
    """Whether a row of (shape, dtype) runs under --dtype and --shape."""
    return (args.dtype is None or dtype in args.dtype) and (args.shape is None or bool(args.shape.search(shape)))


def main(argv):
    args = parse(argv)
    if args.join:
        if args.names or args.dtype or args.shape:
            print("usage: bench_kernels_torch.py --join ROWS.jsonl (no names or filters)", file=sys.stderr)
            return 2
        return join(args.join)
    try:
        import torch
    except ImportError as e:
        print(f"SKIPPED: no torch ({e})")
        return 0
    if not torch.cuda.is_available():
        print(f"SKIPPED: no CUDA GPU (torch {torch.__version__}, built for CUDA {torch.version.cuda}, "
              "sees no device)")
        return 0
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(f"bench_kernels_torch: torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}) on {props.name}; TF32 off; medians of back-to-back runs "
          "between CUDA events", flush=True)
    b = Bench(torch, lambda shape, dtype: keeps(args, shape, dtype))
    for name, family in FAMILIES.items():
        if not args.names or name in args.names:
            print(f"bench_kernels_torch: {name}", file=sys.stderr, flush=True)
            family(b)
    b.table()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
