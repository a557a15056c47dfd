"""PyTorch reference twins of nd::models, written from the papers' code (plain torch.nn,
no timm): PyTorch's examples/dcgan (Generator, Discriminator, weights_init) and
facebookresearch/mae's MaskedAutoencoderViT (models_mae.py) with timm 0.3's PatchEmbed,
Attention, Mlp and Block and util/pos_embed.py's 2-D sin-cos embedding. Imported by
make_models_golden.py (the golden files) and examples/porting/train_gan_mae.py.

closed_form(name, shape) gives weights and inputs both sides compute (the C++ twin is
tests/models/closed_form.h), so full-size goldens need not store weights:
  u_i = splitmix64(fnv1a64(name) + i) >> 11, scaled by 2^-53 into [0, 1); v_i = 2 u_i - 1;
  a tensor of 2+ dims: v_i * sqrt(6 / (numel / shape[0] + shape[0])) (xavier-like);
  a 1-D "*weight" (LayerNorm, BatchNorm): 1 + 0.1 v_i; any other 1-D tensor: 0.02 v_i.
"""
import math

import numpy as np
import torch
import torch.nn as nn

MASK64 = (1 << 64) - 1


# ---- closed-form values -------------------------------------------------------------
def fnv1a64(text):
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def uniform01(name, n):
    """n values in [0, 1): splitmix64 of fnv1a64(name) + i, top 53 bits."""
    with np.errstate(over="ignore"):
        z = np.uint64(fnv1a64(name)) + np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def closed_form(name, shape):
    """float64 tensor of f32-representable values (see the module docstring)."""
    n = math.prod(shape)
    v = 2 * uniform01(name, n) - 1
    if len(shape) >= 2:
        v = v * math.sqrt(6.0 / (n // shape[0] + shape[0]))
    elif name.endswith("weight"):
        v = 1 + 0.1 * v
    else:
        v = 0.02 * v
    return torch.from_numpy(v).reshape(shape).float().double()


def fill_closed_form(module):
    """Every floating parameter except the fixed position embeddings."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not name.endswith("pos_embed"):
                p.copy_(closed_form(name, tuple(p.shape)))


# ---- DCGAN ------------------------------------------------------------------------------
def weights_init(m):
    """examples/dcgan's weights_init."""
    name = m.__class__.__name__
    if name.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif name.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class ExampleGenerator(nn.Module):
    """examples/dcgan's Generator (64x64), layer for layer."""

    def __init__(self, nz=100, ngf=64, nc=3):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class ExampleDiscriminator(nn.Module):
    """examples/dcgan's Discriminator (64x64), layer for layer, Sigmoid included."""

    def __init__(self, ndf=64, nc=3):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 8), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


class Generator(nn.Module):
    """The example's generator for 28x28x1 (7 -> 14 -> 28, a 7x7 first map) or 32x32 (the
    64x64 stack without its widest stage)."""

    def __init__(self, nz, ngf, nc=1, image_size=28):
        super().__init__()
        self.nz = nz
        if image_size == 28:
            layers = [nn.ConvTranspose2d(nz, ngf * 2, 7, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
                      nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True)]
        else:
            assert image_size == 32
            layers = [nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
                      nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
                      nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True)]
        self.main = nn.Sequential(*layers, nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z.view(z.size(0), self.nz, 1, 1))


class Discriminator(nn.Module):
    """The mirror of Generator, ending in a logit (no Sigmoid)."""

    def __init__(self, ndf, nc=1, image_size=28):
        super().__init__()
        if image_size == 28:
            layers = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                      nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2),
                      nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(ndf * 2, 1, 7, 1, 0, bias=False)]
        else:
            assert image_size == 32
            layers = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                      nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2),
                      nn.LeakyReLU(0.2, inplace=True),
                      nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4),
                      nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False)]
        self.main = nn.Sequential(*layers)

    def forward(self, x):
        return self.main(x).view(-1)


# ---- MAE --------------------------------------------------------------------------------
def get_2d_sincos_pos_embed(embed_dim, grid_size, cls_token=False):
    """util/pos_embed.py: the first half encodes the column (w), the second the row."""
    grid = np.meshgrid(np.arange(grid_size, dtype=np.float32), np.arange(grid_size, dtype=np.float32))  # w first
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


class PatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MAE(nn.Module):
    """models_mae.py's MaskedAutoencoderViT (norm_layer LayerNorm eps 1e-6, as its named
    configs), with forward(imgs, noise) taking the masking noise and patchify for any
    in_chans (the reference writes 3)."""

    def __init__(self, embed_dim, depth, num_heads, decoder_embed_dim, decoder_depth, decoder_num_heads, mlp_ratio=4.0,
                 img_size=28, patch_size=4, in_chans=1, mask_ratio=0.75, norm_pix_loss=True):
        super().__init__()
        self.img_size, self.in_chans, self.mask_ratio, self.norm_pix_loss = img_size, in_chans, mask_ratio, norm_pix_loss
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        L = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, L + 1, embed_dim), requires_grad=False)
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim, bias=True)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, L + 1, decoder_embed_dim), requires_grad=False)
        self.decoder_blocks = nn.ModuleList([Block(decoder_embed_dim, decoder_num_heads, mlp_ratio)
                                             for _ in range(decoder_depth)])
        self.decoder_norm = nn.LayerNorm(decoder_embed_dim, eps=1e-6)
        self.decoder_pred = nn.Linear(decoder_embed_dim, patch_size ** 2 * in_chans, bias=True)
        self.initialize_weights()

    def initialize_weights(self):
        grid = int(self.patch_embed.num_patches ** .5)
        self.pos_embed.data.copy_(torch.from_numpy(
            get_2d_sincos_pos_embed(self.pos_embed.shape[-1], grid, cls_token=True)).float().unsqueeze(0))
        self.decoder_pos_embed.data.copy_(torch.from_numpy(
            get_2d_sincos_pos_embed(self.decoder_pos_embed.shape[-1], grid, cls_token=True)).float().unsqueeze(0))
        w = self.patch_embed.proj.weight.data
        torch.nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        torch.nn.init.normal_(self.cls_token, std=.02)
        torch.nn.init.normal_(self.mask_token, std=.02)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def patchify(self, imgs):
        p, c = self.patch_embed.patch_size[0], self.in_chans
        h = w = imgs.shape[2] // p
        x = imgs.reshape(shape=(imgs.shape[0], c, h, p, w, p))
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(shape=(imgs.shape[0], h * w, p ** 2 * c))

    def random_masking(self, x, mask_ratio, noise):
        N, L, D = x.shape
        len_keep = int(L * (1 - mask_ratio))
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L], dtype=x.dtype, device=x.device)
        mask[:, :len_keep] = 0
        return x_masked, torch.gather(mask, dim=1, index=ids_restore), ids_restore

    def forward_encoder(self, x, mask_ratio, noise):
        x = self.patch_embed(x) + self.pos_embed[:, 1:, :]
        x, mask, ids_restore = self.random_masking(x, mask_ratio, noise)
        cls_tokens = (self.cls_token + self.pos_embed[:, :1, :]).expand(x.shape[0], -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, x, ids_restore):
        x = self.decoder_embed(x)
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        x_ = torch.gather(x_, dim=1, index=ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1) + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:, :]

    def forward_loss(self, imgs, pred, mask):
        target = self.patchify(imgs)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.e-6) ** .5
        loss = ((pred - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum()

    def forward(self, imgs, noise, mask_ratio=None):
        ratio = self.mask_ratio if mask_ratio is None else mask_ratio
        latent, mask, ids_restore = self.forward_encoder(imgs, ratio, noise)
        pred = self.forward_decoder(latent, ids_restore)
        return self.forward_loss(imgs, pred, mask), pred, mask


# models_mae.py's named configs (img_size 224, in_chans 3).
VIT_CONFIGS = {
    "mae_vit_base_patch16_dec512d8b": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "mae_vit_large_patch16_dec512d8b": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    "mae_vit_huge_patch14_dec512d8b": dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16),
}


def vit_mae(name, **overrides):
    cfg = dict(VIT_CONFIGS[name], decoder_embed_dim=512, decoder_depth=8, decoder_num_heads=16, mlp_ratio=4.0,
               img_size=224, in_chans=3)
    cfg.update(overrides)
    return MAE(**cfg)
