#!/usr/bin/env python3
"""PyTorch twin of bench/bench_train.cpp: the same two training steps with the same layer
shapes, batch, optimizers, thread count and timing, printing the same table and JSON lines
with impl "pytorch" (baseline: torch.mm of the same size in the same run).

  dcgan  nz 64, ngf = ndf = 32, batch 64, Adam lr 2e-4 betas (0.5, 0.999):
         fake = G(z); D step on bce(D(real), 1) + bce(D(fake.detach()), 0);
         G step on bce(D(fake), 1)  (apps/train_gan's step)
  mae    tiny (embed 64 x 2 blocks, decoder 32 x 1, 4 heads), batch 128, AdamW lr 1e-3
         betas (0.9, 0.95) weight decay 0.05 (apps/train_mae's step)

  NAME   any of bench_train's configs: dcgan28 | dcgan32 | dcgan64 (batch 64) or tiny | small |
         mae_vit_base_patch16_dec512d8b | mae_vit_large_patch16_dec512d8b |
         mae_vit_huge_patch14_dec512d8b (batch 64), on random images of the config's size

The models are tests/golden/reference_models.py's (the PyTorch references the C++ models are
tested against: examples/dcgan's layers, models_mae.py's MaskedAutoencoderViT), so parameter
shapes match nanoddp's one for one; dcgan64's discriminator ends in the logit, its Sigmoid
left to the loss, as nanoddp's. FLOPs per step are counted as in bench_train.cpp (GEMM
FLOPs, training pass = 3x forward). --checkpoint-activations on wraps each MAE block in
torch.utils.checkpoint.checkpoint(use_reentrant=False). On CUDA the rows carry
"peak_bytes" (torch.cuda.max_memory_allocated, reset before the warmup), as bench_train's.
--amp bf16|f16: the step under torch.autocast(dtype) (f16 with torch.amp.GradScaler), as
bench_train --amp; the step rows then carry that dtype.
Usage: python3 bench/bench_train_torch.py [--steps N] [--warmup N] [--threads N]
                                          [--gemm N] [--device cpu|cuda|all] [--model dcgan|mae|all|NAME]
                                          [--amp f32|bf16|f16] [--batch N] [--checkpoint-activations off|on]
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
import reference_models as ref  # noqa: E402

# ---- the configs, as models::DCGANConfig and models::MAEConfig name them ----
DCGAN_CONFIGS = {"dcgan28": dict(image_size=28, nc=1, nz=64, ngf=32, ndf=32),
                 "dcgan32": dict(image_size=32, nc=3, nz=100, ngf=64, ndf=64),
                 "dcgan64": dict(image_size=64, nc=3, nz=100, ngf=64, ndf=64)}
MAE_SMALL_CONFIGS = {
    "tiny": dict(embed_dim=64, depth=2, num_heads=4, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4),
    "small": dict(embed_dim=192, depth=6, num_heads=6, decoder_embed_dim=96, decoder_depth=2, decoder_num_heads=3)}


def mae_config(name):
    if name in MAE_SMALL_CONFIGS:
        return dict(MAE_SMALL_CONFIGS[name], mlp_ratio=4.0, img_size=28, patch_size=4, in_chans=1)
    return dict(ref.VIT_CONFIGS[name], decoder_embed_dim=512, decoder_depth=8, decoder_num_heads=16, mlp_ratio=4.0,
                img_size=224, in_chans=3)


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


def dcgan_step_flops(n, c):
    side, base = c["image_size"], 7 if c["image_size"] % 7 == 0 else 4
    k = (side // base).bit_length() - 1
    ngf, ndf = c["ngf"], c["ndf"]
    g = conv_transpose2d_flops(n, c["nz"], ngf << (k - 1), base, 1)
    g += sum(conv_transpose2d_flops(n, ngf << (k - i), ngf << (k - 1 - i), 4, base << (i - 1)) for i in range(1, k))
    g += conv_transpose2d_flops(n, ngf, c["nc"], 4, base << (k - 1))
    d = conv2d_flops(n, c["nc"], ndf, 4, side // 2)
    d += sum(conv2d_flops(n, ndf << (i - 1), ndf << i, 4, side >> (i + 1)) for i in range(1, k))
    d += conv2d_flops(n, ndf << (k - 1), 1, base, 1)
    return 3.0 * (g + 3.0 * d)


def mae_step_flops(n, c, checkpointed, mask_ratio=0.75):
    patches = (c["img_size"] // c["patch_size"]) ** 2
    patch_dim = c["patch_size"] ** 2 * c["in_chans"]
    enc, dec = 1 + int(patches * (1 - mask_ratio)), 1 + patches
    blocks = (c["depth"] * block_flops(n, enc, c["embed_dim"], c["mlp_ratio"])
              + c["decoder_depth"] * block_flops(n, dec, c["decoder_embed_dim"], c["mlp_ratio"]))
    forward = (linear_flops(n * patches, patch_dim, c["embed_dim"]) + blocks
               + linear_flops(n * enc, c["embed_dim"], c["decoder_embed_dim"])
               + linear_flops(n * dec, c["decoder_embed_dim"], patch_dim))
    return 3.0 * forward + (blocks if checkpointed else 0.0)


# ---- the steps ----
def resolve(model, checkpointed):
    """[(row name, config name, default batch)] for --model, as bench_train.cpp's models_for."""
    out = ([("dcgan", "dcgan28", 64)] if model in ("dcgan", "all") else []) + \
          ([("mae", "tiny", 128)] if model in ("mae", "all") else [])
    return out or [(model, model, 64)]


def shape(config, batch, checkpointed):
    if config in DCGAN_CONFIGS:
        c = DCGAN_CONFIGS[config]
        return (f"{c['image_size']}x{c['image_size']}x{c['nc']} nz={c['nz']} ngf={c['ngf']} ndf={c['ndf']} "
                f"batch={batch} Adam")
    c = mae_config(config)
    return (f"{config} E={c['embed_dim']}x{c['depth']} Ed={c['decoder_embed_dim']}x{c['decoder_depth']} "
            f"batch={batch} AdamW" + (" ckpt" if checkpointed else ""))


def precision(device, amp):
    """torch.autocast for --amp (a no-op context for f32) and a GradScaler (on for f16)."""
    dtype = torch.float16 if amp == "f16" else torch.bfloat16
    autocast = lambda: torch.autocast(device.type, dtype=dtype, enabled=amp != "f32")  # noqa: E731
    return autocast, torch.amp.GradScaler(device.type, enabled=amp == "f16")


def dcgan_nets(c):
    if c["image_size"] == 64:
        G, D = ref.ExampleGenerator(c["nz"], c["ngf"], c["nc"]), ref.ExampleDiscriminator(c["ndf"], c["nc"])
        D.main[-1] = torch.nn.Identity()  # the logit: the Sigmoid goes to the loss
        return G, D
    return (ref.Generator(c["nz"], c["ngf"], c["nc"], c["image_size"]),
            ref.Discriminator(c["ndf"], c["nc"], c["image_size"]))


def dcgan(device, amp, n, config, checkpointed):
    c = DCGAN_CONFIGS[config]
    nz = c["nz"]
    autocast, scaler = precision(device, amp)
    torch.manual_seed(0)
    G, D = dcgan_nets(c)
    G.apply(ref.weights_init)
    D.apply(ref.weights_init)
    G.to(device), D.to(device)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = (torch.rand(n, c["nc"], c["image_size"], c["image_size"]) * 2 - 1).to(device)

    def bce(logits, target):
        return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))

    def step():
        with autocast():
            z = torch.randn(n, nz, 1, 1).to(device)
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

    return n, dcgan_step_flops(n, c), step


class CheckpointedBlock(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)


def mae(device, amp, n, config, checkpointed):
    c = mae_config(config)
    autocast, scaler = precision(device, amp)
    torch.manual_seed(0)
    model = ref.MAE(**c)
    if checkpointed:
        for blocks in (model.blocks, model.decoder_blocks):
            for i in range(len(blocks)):
                blocks[i] = CheckpointedBlock(blocks[i])
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.05)
    images = (torch.rand(n, c["in_chans"], c["img_size"], c["img_size"]) * 2 - 1).to(device)
    patches = (c["img_size"] // c["patch_size"]) ** 2

    def step():
        noise = torch.rand(n, patches).to(device)
        opt.zero_grad()
        with autocast():
            loss = model(images, noise)[0]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss.item()

    return n, mae_step_flops(n, c, checkpointed), step


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
    models = resolve(args.model, args.checkpoint_activations)
    ckpt = args.checkpoint_activations == "on"
    batch = lambda default: args.batch or default  # noqa: E731
    if device.type == "cuda" and not torch.cuda.is_available():
        for name, config, default in models:
            rows.append(dict(op="train_step", model=name, device="cuda:0", impl="pytorch",
                             shape=shape(config, batch(default), ckpt),
                             note="skipped: torch.cuda.is_available() is False"))
        return
    size = args.gemm * (4 if device.type == "cuda" else 1)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    ms, lo, hi = time_steps(lambda: torch.mm(a, b), device, 2, max(5, args.steps // 2))
    base = dict(op="matmul", shape=f"M=N=K={size}", impl="torch.mm", model="sgemm", device=str(device), ms=ms,
                ms_min=lo, ms_max=hi, flops=2.0 * size ** 3, images=0, steps=max(5, args.steps // 2))
    base["gflops"] = base["flops"] / (ms * 1e6)
    rows.append(base)
    for name, config, default in models:
        build = dcgan if config in DCGAN_CONFIGS else mae
        images, flops, step = build(device, args.amp, batch(default), config, ckpt)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ms, lo, hi = time_steps(step, device, args.warmup, args.steps)
        gflops = flops / (ms * 1e6)
        row = dict(op="train_step", shape=shape(config, batch(default), ckpt), impl="pytorch", model=name,
                   device=str(device), ms=ms, dtype=args.amp,
                   ms_min=lo, ms_max=hi, flops=flops, images=images, steps=args.steps, gflops=gflops,
                   baseline="torch.mm", ratio=gflops / base["gflops"])
        if device.type == "cuda":
            row["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        rows.append(row)


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
            if "peak_bytes" in r:
                out["peak_bytes"] = r["peak_bytes"]
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
    p.add_argument("--model", choices=["dcgan", "mae", "all", *DCGAN_CONFIGS, *MAE_SMALL_CONFIGS, *ref.VIT_CONFIGS],
                   default="all")
    p.add_argument("--amp", choices=["f32", "bf16", "f16"], default="f32",
                   help="the step under torch.autocast to this dtype (f16 with a GradScaler)")
    p.add_argument("--batch", type=int, default=0,
                   help="images per step (0: the apps' batch, DCGAN 64, MAE 128; a config name: 64)")
    p.add_argument("--checkpoint-activations", choices=["off", "on"], default="off",
                   help="each MAE block under torch.utils.checkpoint (use_reentrant=False)")
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
