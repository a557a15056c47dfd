#!/usr/bin/env python3
"""Golden values for tests/models/golden_*_test.cpp, computed by PyTorch (the oracle;
nanoddp never depends on it) on the reference twins of reference_models.py, in float64
from float32-representable weights and inputs, stored as float32.

python3 tests/golden/make_models_golden.py writes, beside this script:
  models_dcgan.safetensors  "G.*", "D.*": 28x28 G (nz 8, ngf 4) and D (ndf 4), one Adam
                            step (lr 1e-3, betas (0.5, 0.999)); G's loss sum(G(z) * grad_out),
                            D's BCE-with-logits
  models_mae.safetensors    "MAE.*": a 28x28x1 MAE (E 16, depth 1, 2 heads; Ed 8, depth 1,
                            2 heads), fixed masking noise, norm_pix_loss, one AdamW step
                            (lr 1e-3, weight_decay 0.05)
    with "param.<name>" (state dict before), "input.*", "out.*", "grad.*" (every trained
    parameter) and "after.*" (state dict after the step)
  models_full.safetensors   closed-form weights and inputs (reference_models.closed_form),
                            one forward and backward at batch 2, nothing stored but results:
    "dcgan64.G.*", "dcgan64.D.*": examples/dcgan's networks (the Sigmoid one's output
      "out.prob", its BCELoss "out.loss"); "dcgan32.G.*", "dcgan32.D.*" (logits)
    "mae_twin.*": ViT-B's structure at E 64, depth 2, 4 heads; Ed 32, depth 1, 4 heads;
      32x32x3 images on 8x8 patches, norm_pix_loss; "mae_twin_raw.*" the same without it
    each tensor as recorded by Record.put: "<key>" the values (every stride-th, flattened,
    above 16384 values), "stride.<key>", "shape.<key>", "norm.<key>" (the f64 L2 norm of all)
  mae_keys.txt              "<config> <key> <d0>x<d1>..." for the three paper configs'
                            state dicts (built on the meta device)
python3 make_models_golden.py --vit DIR   DIR/vit.safetensors: ViT-B at full size (batch 2),
                            ViT-L and ViT-H with 2 encoder and 2 decoder blocks (batch 1), as
                            models_full's (golden_mae_test runs this where torch is installed)
python3 make_models_golden.py --pth DIR   DIR/mae_twin.pth (main_pretrain.py's checkpoint
                            layout: "model", "optimizer", "epoch", "scaler", "args"),
                            DIR/mae_twin_encoder.pth (the encoder's keys alone, as the released
                            pretrain checkpoints), DIR/no_model.pth (no state dict), and
                            DIR/expected.safetensors (inputs, the loss and the unmasked encoder
                            latent of those weights)
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_models import (MAE, VIT_CONFIGS, Discriminator, ExampleDiscriminator,  # noqa: E402
                              ExampleGenerator, Generator, closed_form, fill_closed_form, uniform01, vit_mae,
                              weights_init)

HERE = os.path.dirname(os.path.abspath(__file__))
# The twin of the ViT configs that tests/models/golden_mae_test.cpp builds too.
MAE_TWIN = dict(embed_dim=64, depth=2, num_heads=4, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4,
                mlp_ratio=4.0, img_size=32, patch_size=8, in_chans=3)


def f32(t):
    """Rounds to float32 values, kept as float64."""
    return t.float().double()


def uniform(name, shape, lo, hi):
    """Closed-form inputs in [lo, hi) (tests/models/closed_form.h's uniform)."""
    return f32(torch.from_numpy(lo + (hi - lo) * uniform01(name, math.prod(shape))).reshape(shape))


# ---- one training step, everything stored (the small 28x28 models) ----------------------
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
    out.update({f"grad.{k}": p.grad for k, p in module.named_parameters() if p.requires_grad})
    optimizer(module.parameters()).step()
    out.update({f"after.{k}": v.detach().clone() for k, v in module.state_dict().items()})
    return {f"{prefix}.{k}": (v.float() if v.is_floating_point() else v).contiguous() for k, v in out.items()}


def small_models():
    torch.manual_seed(0)
    adam = lambda params: torch.optim.Adam(params, lr=1e-3, betas=(0.5, 0.999))  # noqa: E731
    batch = 4
    G = Generator(8, 4)
    G.apply(weights_init)
    z, grad_out = f32(torch.randn(batch, 8)), f32(torch.randn(batch, 1, 28, 28))

    def run_g(m, ins):
        fake = m(ins["z"])
        return (fake * ins["grad_out"]).sum(), {"fake": fake}

    tensors = step("G", G, {"z": z, "grad_out": grad_out}, run_g, adam)
    D = Discriminator(4)
    D.apply(weights_init)
    x = f32(torch.rand(batch, 1, 28, 28) * 2 - 1)
    y = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)

    def run_d(m, ins):
        logits = m(ins["x"])
        loss = F.binary_cross_entropy_with_logits(logits, ins["y"])
        return loss, {"logits": logits, "loss": loss}

    tensors.update(step("D", D, {"x": x, "y": y}, run_d, adam))
    save_file(tensors, os.path.join(HERE, "models_dcgan.safetensors"), metadata={"torch": torch.__version__})

    mae = MAE(embed_dim=16, depth=1, num_heads=2, decoder_embed_dim=8, decoder_depth=1, decoder_num_heads=2)
    images = f32(torch.rand(batch, 1, 28, 28) * 2 - 1)
    noise = f32(torch.rand(batch, 49))

    def run_mae(m, ins):
        loss, pred, mask = m(ins["images"], ins["noise"])
        return loss, {"loss": loss, "pred": pred, "mask": mask}

    adamw = lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)  # noqa: E731
    save_file(step("MAE", mae, {"images": images, "noise": noise}, run_mae, adamw),
              os.path.join(HERE, "models_mae.safetensors"), metadata={"torch": torch.__version__})


# ---- closed-form weights, results only ----------------------------------------------------
class Record:
    """Tensors by key, large ones as every stride-th value (see the module docstring)."""

    def __init__(self):
        self.tensors = {}

    def put(self, key, tensor, limit=16384, samples=2048):
        flat = tensor.detach().double().reshape(-1)
        stride = 1 if flat.numel() <= limit else -(-flat.numel() // samples)
        self.tensors[key] = flat[::stride].float().contiguous()
        self.tensors["stride." + key] = torch.tensor(stride, dtype=torch.int64)
        self.tensors["shape." + key] = torch.tensor(list(tensor.shape), dtype=torch.int64)
        self.tensors["norm." + key] = flat.norm().reshape(())

    def grads(self, prefix, module, **kw):
        for name, p in module.named_parameters():
            if p.requires_grad:
                self.put(f"{prefix}.grad.{name}", p.grad, **kw)


def closed_form_module(module):
    module = module.double()
    fill_closed_form(module)
    return module


def dcgan(rec, name, G, D, nz, nc, size, sigmoid):
    """G: fake = G(z), loss sum(fake * grad_out); D: logits (or the example's
    probabilities) on closed-form images, BCE against labels [1, 0]. Train mode."""
    G = closed_form_module(G)
    z = uniform("z", (2, nz), -2, 2)
    fake = G(z.view(2, nz, 1, 1))
    loss = (fake * uniform("grad_out", tuple(fake.shape), -1, 1)).sum()
    loss.backward()
    rec.put(f"{name}.G.out.fake", fake)
    rec.put(f"{name}.G.out.loss", loss)
    rec.grads(f"{name}.G", G)
    for k, v in G.state_dict().items():
        if "running" in k:
            rec.put(f"{name}.G.buffer.{k}", v)
    D = closed_form_module(D)
    x = uniform("images", (2, nc, size, size), -1, 1)
    y = torch.tensor([1.0, 0.0], dtype=torch.float64)
    out = D(x)
    loss = F.binary_cross_entropy(out, y) if sigmoid else F.binary_cross_entropy_with_logits(out, y)
    loss.backward()
    rec.put(f"{name}.D.out.{'prob' if sigmoid else 'logits'}", out)
    rec.put(f"{name}.D.out.loss", loss)
    rec.grads(f"{name}.D", D)


def mae_result(rec, name, mae, batch, **kw):
    """Closed-form weights, images and noise; loss, pred, mask, latent and gradients."""
    mae = closed_form_module(mae)
    images = uniform("images", (batch, mae.in_chans, mae.img_size, mae.img_size), -1, 1)
    noise = uniform("noise", (batch, mae.patch_embed.num_patches), 0, 1)
    latent, mask, ids_restore = mae.forward_encoder(images, mae.mask_ratio, noise)
    pred = mae.forward_decoder(latent, ids_restore)
    loss = mae.forward_loss(images, pred, mask)
    loss.backward()
    for key, value in [("loss", loss), ("pred", pred), ("mask", mask), ("latent", latent)]:
        rec.put(f"{name}.out.{key}", value, **kw)
    rec.grads(name, mae, **kw)


def full_size():
    rec = Record()
    dcgan(rec, "dcgan64", ExampleGenerator(100, 64, 3), ExampleDiscriminator(64, 3), 100, 3, 64, sigmoid=True)
    dcgan(rec, "dcgan32", Generator(100, 64, 3, 32), Discriminator(64, 3, 32), 100, 3, 32, sigmoid=False)
    mae_result(rec, "mae_twin", MAE(**MAE_TWIN), 2)
    mae_result(rec, "mae_twin_raw", MAE(**MAE_TWIN, norm_pix_loss=False), 2, limit=0, samples=256)
    save_file(rec.tensors, os.path.join(HERE, "models_full.safetensors"), metadata={"torch": torch.__version__})
    lines = []
    for name in VIT_CONFIGS:
        with torch.device("meta"):
            model = vit_mae(name)
        lines += [f"{name} {k} {'x'.join(str(d) for d in v.shape)}" for k, v in model.state_dict().items()]
    with open(os.path.join(HERE, "mae_keys.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def vit(out_dir):
    rec = Record()
    mae_result(rec, "vit_b", vit_mae("mae_vit_base_patch16_dec512d8b"), 2)
    for short, name in [("vit_l2", "mae_vit_large_patch16_dec512d8b"), ("vit_h2", "mae_vit_huge_patch14_dec512d8b")]:
        mae_result(rec, short, vit_mae(name, depth=2, decoder_depth=2), 1)
    save_file(rec.tensors, os.path.join(out_dir, "vit.safetensors"))


def pth(out_dir):
    torch.manual_seed(3)
    mae = MAE(**MAE_TWIN)  # the reference's own init, in f32 as a trained checkpoint holds
    state = mae.state_dict()
    torch.save({"model": state, "optimizer": {"state": {}, "param_groups": []}, "epoch": 3, "scaler": {},
                "args": argparse.Namespace(model="mae_twin", norm_pix_loss=True)},
               os.path.join(out_dir, "mae_twin.pth"))
    encoder = {k: v for k, v in state.items() if k != "mask_token" and not k.startswith("decoder_")}
    torch.save({"model": encoder}, os.path.join(out_dir, "mae_twin_encoder.pth"))
    torch.save({"epoch": 3}, os.path.join(out_dir, "no_model.pth"))  # what the tool must refuse
    mae = mae.double()
    images = uniform("images", (2, 3, 32, 32), -1, 1)
    noise = uniform("noise", (2, 16), 0, 1)
    with torch.no_grad():
        loss, _, _ = mae(images, noise)
        latent, _, _ = mae.forward_encoder(images, 0.0, torch.arange(16.0).repeat(2, 1))
    save_file({"images": images.float(), "noise": noise.float(), "loss": loss.float().reshape(()),
               "latent": latent.float().contiguous()}, os.path.join(out_dir, "expected.safetensors"))


def main():
    parser = argparse.ArgumentParser(description="PyTorch golden values for tests/models")
    parser.add_argument("--vit", metavar="DIR", help="write DIR/vit.safetensors (full ViT-B, 2-block ViT-L/H)")
    parser.add_argument("--pth", metavar="DIR", help="write a reference MAE's .pth checkpoints into DIR")
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.vit:
        vit(args.vit)
    elif args.pth:
        pth(args.pth)
    else:
        small_models()
        full_size()


if __name__ == "__main__":
    main()
