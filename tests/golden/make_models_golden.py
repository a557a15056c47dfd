#!/usr/bin/env python3
"""Golden values for tests/models/golden_models_test.cpp, computed by PyTorch (the
oracle; nanoddp never depends on it). The same tiny DCGAN generator and discriminator
and a tiny MAE as models/ builds, with the same parameter names, each run for one
training step on a fixed batch: forward, backward, one optimizer step.

Computed in float64 from float32-representable weights and inputs, then stored as
float32 (the rounding of an exact reference). Outputs, one safetensors file per model:
  models_dcgan.safetensors  keys "G.*" and "D.*"
  models_mae.safetensors    keys "MAE.*"
with, under each prefix: "param.<name>" the state dict before the step (parameters and
buffers), "input.<name>" inputs, "out.<name>" outputs, "grad.<name>" every parameter's
gradient, "after.<name>" the state dict after the optimizer step.

Steps (the C++ test repeats them):
  G:   fake = G(z) (train mode); loss = sum(fake * grad_out); Adam(lr 1e-3, betas (0.5, 0.999))
  D:   logits = D(x) (train mode); loss = BCEWithLogits(logits, y); Adam(lr 1e-3, betas (0.5, 0.999))
  MAE: loss, pred, mask = MAE(images, noise) (mask_ratio 0.75, norm_pix_loss);
       AdamW(lr 1e-3, weight_decay 0.05)
Run: python3 tests/golden/make_models_golden.py
"""
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))

# The tiny configurations (tests/models/golden_models_test.cpp uses the same).
NZ, NGF, NDF = 8, 4, 4
MAE_CFG = dict(embed_dim=16, depth=1, num_heads=2, decoder_embed_dim=8, decoder_depth=1, decoder_num_heads=2,
               mlp_ratio=4.0)
BATCH = 4


def f32(t):
    """Rounds to float32 values, kept as float64."""
    return t.float().double()


# ---- DCGAN (PyTorch's DCGAN example, cut to 28x28) ----
class Generator(nn.Module):
    def __init__(self, nz, ngf):
        super().__init__()
        self.nz = nz
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 7, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z.view(z.size(0), self.nz, 1, 1))


class Discriminator(nn.Module):
    def __init__(self, ndf):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 7, 1, 0, bias=False))

    def forward(self, x):
        return self.main(x).view(-1)


def weights_init(m):
    name = m.__class__.__name__
    if name.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif name.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


# ---- MAE (facebookresearch/mae models_mae.py with nn.MultiheadAttention blocks) ----
def get_2d_sincos_pos_embed(embed_dim, grid_size, cls_token=False):
    grid = np.meshgrid(np.arange(grid_size, dtype=np.float64), np.arange(grid_size, dtype=np.float64))  # w first
    grid = np.stack(grid, axis=0).reshape([2, 1, grid_size, grid_size])

    def one_d(dim, pos):
        omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
        omega = 1.0 / 10000 ** omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    emb = np.concatenate([one_d(embed_dim // 2, grid[0]), one_d(embed_dim // 2, grid[1])], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)
    return emb


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class MAE(nn.Module):
    def __init__(self, embed_dim, depth, num_heads, decoder_embed_dim, decoder_depth, decoder_num_heads, mlp_ratio,
                 img_size=28, patch_size=4, mask_ratio=0.75):
        super().__init__()
        self.p, self.grid, self.mask_ratio = patch_size, img_size // patch_size, mask_ratio
        L = self.grid ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.register_buffer("pos_embed", torch.from_numpy(
            get_2d_sincos_pos_embed(embed_dim, self.grid, True)).float().view(1, L + 1, embed_dim))
        self.register_buffer("decoder_pos_embed", torch.from_numpy(
            get_2d_sincos_pos_embed(decoder_embed_dim, self.grid, True)).float().view(1, L + 1, decoder_embed_dim))
        self.patch_embed = nn.Linear(patch_size * patch_size, embed_dim)
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim)
        self.decoder_blocks = nn.ModuleList([Block(decoder_embed_dim, decoder_num_heads, mlp_ratio)
                                             for _ in range(decoder_depth)])
        self.decoder_norm = nn.LayerNorm(decoder_embed_dim, eps=1e-6)
        self.decoder_pred = nn.Linear(decoder_embed_dim, patch_size * patch_size)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.constant_(m.bias, 0)

    def patchify(self, imgs):
        p, h = self.p, self.grid
        x = imgs.reshape(imgs.shape[0], 1, h, p, h, p)
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(imgs.shape[0], h * h, p * p)

    def random_masking(self, x, noise):
        N, L, D = x.shape
        len_keep = int(L * (1 - self.mask_ratio))
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, 1, ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L], dtype=x.dtype, device=x.device)
        mask[:, :len_keep] = 0
        return x_masked, torch.gather(mask, 1, ids_restore), ids_restore

    def forward(self, imgs, noise):
        x = self.patch_embed(self.patchify(imgs)) + self.pos_embed[:, 1:, :]
        x, mask, ids_restore = self.random_masking(x, noise)
        cls = (self.cls_token + self.pos_embed[:, :1, :]).expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1)
        for blk in self.blocks:
            x = blk(x)
        x = self.decoder_embed(self.norm(x))
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1) + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)
        pred = self.decoder_pred(self.decoder_norm(x))[:, 1:, :]
        target = self.patchify(imgs)
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.e-6) ** .5
        loss = ((pred - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum(), pred, mask


def step(prefix, module, inputs, run, optimizer):
    """Rounds weights to f32, runs run(module, inputs) -> (loss, outputs), backward, one step."""
    module = module.double()
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point():
                t.copy_(f32(t))
    out = {}
    out.update({f"param.{k}": v.detach().clone() for k, v in module.state_dict().items()})
    out.update({f"input.{k}": v for k, v in inputs.items()})
    loss, outputs = run(module, inputs)
    out.update({f"out.{k}": v.detach() for k, v in outputs.items()})
    loss.backward()
    out.update({f"grad.{k}": p.grad for k, p in module.named_parameters()})
    optimizer(module.parameters()).step()
    out.update({f"after.{k}": v.detach().clone() for k, v in module.state_dict().items()})
    return {f"{prefix}.{k}": (v.float() if v.is_floating_point() else v).contiguous() for k, v in out.items()}


def main():
    torch.manual_seed(0)
    adam = lambda params: torch.optim.Adam(params, lr=1e-3, betas=(0.5, 0.999))

    G = Generator(NZ, NGF)
    G.apply(weights_init)
    z, grad_out = f32(torch.randn(BATCH, NZ)), f32(torch.randn(BATCH, 1, 28, 28))

    def run_g(m, ins):
        fake = m(ins["z"])
        return (fake * ins["grad_out"]).sum(), {"fake": fake}

    tensors = step("G", G, {"z": z, "grad_out": grad_out}, run_g, adam)

    D = Discriminator(NDF)
    D.apply(weights_init)
    x = f32(torch.rand(BATCH, 1, 28, 28) * 2 - 1)
    y = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)

    def run_d(m, ins):
        logits = m(ins["x"])
        loss = F.binary_cross_entropy_with_logits(logits, ins["y"])
        return loss, {"logits": logits, "loss": loss}

    tensors.update(step("D", D, {"x": x, "y": y}, run_d, adam))
    save_file(tensors, os.path.join(HERE, "models_dcgan.safetensors"), metadata={"torch": torch.__version__})

    mae = MAE(**MAE_CFG)
    images = f32(torch.rand(BATCH, 1, 28, 28) * 2 - 1)
    noise = f32(torch.rand(BATCH, 49))

    def run_mae(m, ins):
        loss, pred, mask = m(ins["images"], ins["noise"])
        return loss, {"loss": loss, "pred": pred, "mask": mask}

    adamw = lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)
    save_file(step("MAE", mae, {"images": images, "noise": noise}, run_mae, adamw),
              os.path.join(HERE, "models_mae.safetensors"), metadata={"torch": torch.__version__})


if __name__ == "__main__":
    main()
