#!/usr/bin/env python3
"""train_gan_mae.py: the PyTorch side of docs/porting.md. A DCGAN (G + D, Adam) and an
MAE (AdamW + cosine schedule) trained together on Fashion-MNIST under
DistributedDataParallel, with SyncBatchNorm on GPUs, optional mixed precision (--amp,
bf16; --amp-dtype f16 adds loss scaling) and a checkpoint that --resume continues from.
train_gan_mae.cpp beside it is the same program in nanoddp, line for line.

Run alone (a world of one process):  python3 examples/porting/train_gan_mae.py --steps 5
or with ranks:                        torchrun --nproc_per_node 2 examples/porting/train_gan_mae.py
The models are the PyTorch twins of nd::models that tests/golden/make_models_golden.py
checks nanoddp against (same layers, same parameter names); a project of your own would
import its own model file here. Needs torch, numpy and safetensors (which that file imports).
"""
import argparse
import gzip
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from make_models_golden import MAE, Discriminator, Generator, weights_init  # noqa: E402

NZ, NGF, NDF = 64, 32, 32  # nd::models::DCGANGenerator(64, 32), DCGANDiscriminator(32)
MAE_TINY = dict(embed_dim=64, depth=2, num_heads=4, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4,
                mlp_ratio=4.0)  # nd::models::MAEConfig::tiny()


def load_fashion_mnist(folder):
    """The training images as [60000, 1, 28, 28] f32 in [-1, 1] (nd::data::load_fashion_mnist)."""
    with gzip.open(os.path.join(folder, "train-images-idx3-ubyte.gz")) as f:
        pixels = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    return torch.from_numpy(pixels.astype(np.float32) / 127.5 - 1.0)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64, help="global: split evenly over the ranks")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--out", default="out/train_gan_mae_torch")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--amp-dtype", default="bf16", choices=["bf16", "f16"])
    return p.parse_args()


def main():
    args = parse_args()
    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous; a plain `python3`
    # start is a world of one whose store lives in this process.
    backend = "nccl" if args.device == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if args.device == "cuda" else "cpu")
    amp_dtype = torch.float16 if args.amp_dtype == "f16" else torch.bfloat16
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    G, D, M = Generator(NZ, NGF), Discriminator(NDF), MAE(**MAE_TINY)
    G.apply(weights_init)
    D.apply(weights_init)
    if device.type == "cuda":  # PyTorch's SyncBatchNorm refuses CPU tensors in training
        G = nn.SyncBatchNorm.convert_sync_batchnorm(G)
        D = nn.SyncBatchNorm.convert_sync_batchnorm(D)
    ids = [local_rank] if device.type == "cuda" else None
    g = DDP(G.to(device), device_ids=ids)
    d = DDP(D.to(device), device_ids=ids)
    m = DDP(M.to(device), device_ids=ids)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_m = torch.optim.AdamW(M.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.05)
    sched_m = torch.optim.lr_scheduler.CosineAnnealingLR(opt_m, T_max=args.steps)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and amp_dtype == torch.float16)

    start = 0
    if args.resume:
        # Every rank reads the file onto its own device; the keys are the bare modules'
        # (saved from G, not g, so there is no "module." prefix to strip).
        ckpt = torch.load(ckpt_path, map_location=device)
        for name, part in [("G", G), ("D", D), ("MAE", M), ("opt_g", opt_g), ("opt_d", opt_d), ("opt_m", opt_m),
                           ("sched_m", sched_m), ("scaler", scaler)]:
            part.load_state_dict(ckpt[name])
        start = ckpt["step"]
        torch.set_rng_state(ckpt["rng"])

    data = TensorDataset(load_fashion_mnist(args.data))
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size // world_size, sampler=sampler, drop_last=True)
    epoch = start // len(loader)  # a resumed run restarts the epoch it stopped in
    sampler.set_epoch(epoch)
    batches = iter(loader)

    def bce(logits, target):
        return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))

    for step in range(start + 1, args.steps + 1):
        try:
            (real,) = next(batches)
        except StopIteration:
            epoch += 1
            sampler.set_epoch(epoch)
            batches = iter(loader)
            (real,) = next(batches)
        real = real.to(device)
        z = torch.randn(real.size(0), NZ, device=device)
        noise = torch.rand(real.size(0), 49, device=device)  # which MAE patches stay visible

        with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
            fake = g(z)
            # D called twice, then one backward through both calls.
            loss_d = bce(d(real), 1.0) + bce(d(fake.detach()), 0.0)
        opt_d.zero_grad()
        scaler.scale(loss_d).backward()
        scaler.step(opt_d)

        with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
            loss_g = bce(d(fake), 1.0)  # a fresh forward: D's step changed the weights it saves
        opt_g.zero_grad()
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)

        with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
            loss_m, _, _ = m(real, noise)
        opt_m.zero_grad()
        scaler.scale(loss_m).backward()
        scaler.step(opt_m)
        scaler.update()  # once per iteration, after the three steps
        sched_m.step()

        if rank == 0:
            print(f"step {step}: loss_d {loss_d.item():.4f} loss_g {loss_g.item():.4f} loss_mae {loss_m.item():.4f}")
    if rank == 0 and args.steps > start:
        ckpt = {"G": G.state_dict(), "D": D.state_dict(), "MAE": M.state_dict(), "opt_g": opt_g.state_dict(),
                "opt_d": opt_d.state_dict(), "opt_m": opt_m.state_dict(), "sched_m": sched_m.state_dict(),
                "scaler": scaler.state_dict(), "step": args.steps, "rng": torch.get_rng_state()}
        torch.save(ckpt, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)  # a crash never leaves half a checkpoint
        print(f"checkpoint: {ckpt_path} (step {args.steps})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
