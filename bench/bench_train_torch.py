#!/usr/bin/env python3
"""PyTorch twin of bench/bench_train.cpp: the same two training steps with the same layer
shapes, batch, optimizers, thread count and timing, printing the same table and JSON lines
with impl "pytorch" (baseline: torch.mm of the same size in the same run).

  dcgan  nz 64, ngf = ndf = 32, batch 64, Adam lr 2e-4 betas (0.5, 0.999):
         fake = G(z); D step on bce(D(real), 1) + bce(D(fake.detach()), 0);
         G step on bce(D(fake), 1)  (apps/train_gan's step)
  mae    tiny (embed 64 x 2 blocks, decoder 32 x 1, 4 heads), batch 128, AdamW lr 1e-3
         betas (0.9, 0.95) weight decay 0.05 (apps/train_mae's step)

The models are tests/golden/make_models_golden.py's (the oracle the C++ models are tested
against), so parameter shapes match nanoddp's one for one. FLOPs per step are counted as
in bench_train.cpp (GEMM FLOPs, training pass = 3x forward).
--amp bf16|f16: the step under torch.autocast(dtype) (f16 with torch.amp.GradScaler), as
bench_train --amp; the step rows then carry that dtype.
Usage: python3 bench/bench_train_torch.py [--steps N] [--warmup N] [--threads N]
                                          [--gemm N] [--device cpu|cuda|all] [--model dcgan|mae|all]
                                          [--amp f32|bf16|f16] [--batch N]
--batch N: N images per step instead of the apps' batch (bench_train.cpp --batch).
--threads 0 (default) keeps torch's default (OMP_NUM_THREADS when set).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
import make_models_golden as golden  # noqa: E402


class MAE(golden.MAE):
    """The golden MAE with its mask made on the input's device (the golden one is CPU-only)."""

    def random_masking(self, x, noise):
        N, L, D = x.shape
        len_keep = int(L * (1 - self.mask_ratio))
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        x_masked = torch.gather(x, 1, ids_shuffle[:, :len_keep].unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L], dtype=x.dtype, device=x.device)
        mask[:, :len_keep] = 0
        return x_masked, torch.gather(mask, 1, ids_restore), ids_restore


# ---- FLOPs (forward; a training pass is 3x), as bench_train.cpp counts them ----
def conv2d_flops(n, c_in, c_out, k, out_hw):
    return 2.0 * n * c_out * out_hw * out_hw * c_in * k * k


def conv_transpose2d_flops(n, c_in, c_out, k, in_hw):
    return 2.0 * n * c_in * in_hw * in_hw * c_out * k * k


def linear_flops(rows, d_in, d_out):
    return 2.0 * rows * d_in * d_out


def block_flops(n, seq, dim, mlp_ratio):
    rows, hidden = n * seq, int(dim * mlp_ratio)
    return (linear_flops(rows, dim, 3 * dim) + 4.0 * n * seq * seq * dim + linear_flops(rows, dim, dim)
            + linear_flops(rows, dim, hidden) + linear_flops(rows, hidden, dim))


def dcgan_step_flops(n, nz, ngf, ndf):
    g = (conv_transpose2d_flops(n, nz, 2 * ngf, 7, 1) + conv_transpose2d_flops(n, 2 * ngf, ngf, 4, 7)
         + conv_transpose2d_flops(n, ngf, 1, 4, 14))
    d = conv2d_flops(n, 1, ndf, 4, 14) + conv2d_flops(n, ndf, 2 * ndf, 4, 7) + conv2d_flops(n, 2 * ndf, 1, 7, 1)
    return 3.0 * (g + 3.0 * d)


MAE_TINY = dict(embed_dim=64, depth=2, num_heads=4, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4,
                mlp_ratio=4.0)


def mae_step_flops(n, c, patches=49, patch_dim=16, mask_ratio=0.75):
    enc, dec = 1 + int(patches * (1 - mask_ratio)), 1 + patches
    forward = (linear_flops(n * patches, patch_dim, c["embed_dim"])
               + c["depth"] * block_flops(n, enc, c["embed_dim"], c["mlp_ratio"])
               + linear_flops(n * enc, c["embed_dim"], c["decoder_embed_dim"])
               + c["decoder_depth"] * block_flops(n, dec, c["decoder_embed_dim"], c["mlp_ratio"])
               + linear_flops(n * dec, c["decoder_embed_dim"], patch_dim))
    return 3.0 * forward


# ---- the steps ----
DEFAULT_BATCH = {"dcgan": 64, "mae": 128}  # the apps' batch sizes


def shape(model, batch):
    return {"dcgan": f"nz=64 ngf=32 ndf=32 batch={batch} Adam", "mae": f"tiny E=64x2 Ed=32x1 batch={batch} AdamW"}[model]


def precision(device, amp):
    """torch.autocast for --amp (a no-op context for f32) and a GradScaler (on for f16)."""
    dtype = torch.float16 if amp == "f16" else torch.bfloat16
    autocast = lambda: torch.autocast(device.type, dtype=dtype, enabled=amp != "f32")  # noqa: E731
    return autocast, torch.amp.GradScaler(device.type, enabled=amp == "f16")


def dcgan(device, amp, n):
    nz, ngf, ndf = 64, 32, 32
    autocast, scaler = precision(device, amp)
    torch.manual_seed(0)
    G, D = golden.Generator(nz, ngf), golden.Discriminator(ndf)
    G.apply(golden.weights_init)
    D.apply(golden.weights_init)
    G.to(device), D.to(device)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = (torch.rand(n, 1, 28, 28) * 2 - 1).to(device)

    def bce(logits, target):
        return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))

    def step():
        with autocast():
            z = torch.randn(n, nz).to(device)
            fake = G(z)
            opt_d.zero_grad()
            loss_d = bce(D(real), 1.0) + bce(D(fake.detach()), 0.0)
        scaler.scale(loss_d).backward()
        scaler.step(opt_d)
        with autocast():
            opt_g.zero_grad()
            loss_g = bce(D(fake), 1.0)
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)
        scaler.update()
        loss_d.item(), loss_g.item()

    return n, dcgan_step_flops(n, nz, ngf, ndf), step


def mae(device, amp, n):
    autocast, scaler = precision(device, amp)
    torch.manual_seed(0)
    model = MAE(**MAE_TINY).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.05)
    images = (torch.rand(n, 1, 28, 28) * 2 - 1).to(device)

    def step():
        noise = torch.rand(n, 49).to(device)
        opt.zero_grad()
        with autocast():
            loss = model(images, noise)[0]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss.item()

    return n, mae_step_flops(n, MAE_TINY), step


# ---- timing and output ----
def time_steps(fn, device, warmup, steps):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median_high(ms), min(ms), max(ms)


def bench_device(device, args, rows):
    builders = [b for b in (dcgan, mae) if args.model in ("all", b.__name__)]
    batch = lambda b: args.batch or DEFAULT_BATCH[b.__name__]  # noqa: E731
    if device.type == "cuda" and not torch.cuda.is_available():
        for b in builders:
            rows.append(dict(op="train_step", model=b.__name__, device="cuda:0", impl="pytorch",
                             shape=shape(b.__name__, batch(b)), note="skipped: torch.cuda.is_available() is False"))
        return
    size = args.gemm * (4 if device.type == "cuda" else 1)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    ms, lo, hi = time_steps(lambda: torch.mm(a, b), device, 2, max(5, args.steps // 2))
    base = dict(op="matmul", shape=f"M=N=K={size}", impl="torch.mm", model="sgemm", device=str(device), ms=ms,
                ms_min=lo, ms_max=hi, flops=2.0 * size ** 3, images=0, steps=max(5, args.steps // 2))
    base["gflops"] = base["flops"] / (ms * 1e6)
    rows.append(base)
    for build in builders:
        images, flops, step = build(device, args.amp, batch(build))
        ms, lo, hi = time_steps(step, device, args.warmup, args.steps)
        gflops = flops / (ms * 1e6)
        rows.append(dict(op="train_step", shape=shape(build.__name__, batch(build)), impl="pytorch", model=build.__name__,
                         device=str(device), ms=ms, dtype=args.amp,
                         ms_min=lo, ms_max=hi, flops=flops, images=images, steps=args.steps, gflops=gflops,
                         baseline="torch.mm", ratio=gflops / base["gflops"]))


def report(rows, threads):
    print(f"bench_train_torch: torch {torch.__version__}, {threads} thread(s); median step; "
          "ratio = achieved GFLOP/s / sgemm GFLOP/s")
    print(f"{'model':<7} {'device':<6} {'shape':<36} {'impl':<11} {'ms':>9} {'steps/s':>8} {'images/s':>9} "
          f"{'GFLOP/s':>8} {'ratio':>6}")
    for r in rows:
        if "ms" not in r:
            print(f"{r['model']:<7} {r['device']:<6} {r['shape']:<36} {r['impl']:<11} {r['note']}")
            continue
        ratio = f"{r['ratio']:6.3f}" if "ratio" in r else f"{'-':>6}"
        images = f"{r['images'] * 1e3 / r['ms']:9.0f}" if r["images"] else f"{'-':>9}"
        print(f"{r['model']:<7} {r['device']:<6} {r['shape']:<36} {r['impl']:<11} {r['ms']:9.2f} "
              f"{1e3 / r['ms']:8.2f} {images} {r['gflops']:8.1f} {ratio}")
    for r in rows:
        out = dict(op=r["op"], shape=r["shape"], dtype=r.get("dtype", "f32"), impl=r["impl"], ms=None, gflops=None, gbps=None,
                   baseline=r.get("baseline"), ratio=r.get("ratio"), model=r["model"], device=r["device"],
                   threads=threads)
        if "ms" in r:
            out.update(ms=round(r["ms"], 4), gflops=round(r["gflops"], 3))
            if out["ratio"] is not None:
                out["ratio"] = round(out["ratio"], 4)
            out.update(ms_min=round(r["ms_min"], 4), ms_max=round(r["ms_max"], 4), runs=r["steps"])
            if r["images"]:
                out.update(steps_per_s=round(1e3 / r["ms"], 3), images_per_s=round(r["images"] * 1e3 / r["ms"], 1),
                           gflop_per_step=round(r["flops"] / 1e9, 4))
        else:
            out["note"] = r["note"]
        print(json.dumps(out, separators=(",", ":")))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--gemm", type=int, default=1024, help="M = N = K of the reference sgemm (CUDA: 4x)")
    p.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    p.add_argument("--model", choices=["dcgan", "mae", "all"], default="all")
    p.add_argument("--amp", choices=["f32", "bf16", "f16"], default="f32",
                   help="the step under torch.autocast to this dtype (f16 with a GradScaler)")
    p.add_argument("--batch", type=int, default=0, help="images per step (0: the apps' batch, DCGAN 64, MAE 128)")
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 0 or args.gemm < 1 or args.batch < 0:
        p.error("--steps and --gemm must be >= 1, --warmup, --threads and --batch >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for dev in (["cpu"] if args.device != "cuda" else []) + (["cuda"] if args.device != "cpu" else []):
        bench_device(torch.device(dev if dev == "cpu" else "cuda:0"), args, rows)
    report(rows, torch.get_num_threads())


if __name__ == "__main__":
    main()
