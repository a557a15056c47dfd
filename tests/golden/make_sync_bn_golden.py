#!/usr/bin/env python3
"""Golden values for tests/dist/sync_bn_golden_test.cpp, computed by PyTorch (the
oracle; nanoddp never depends on it): one training step of a small model with a
BatchNorm2d on a global batch of 8 samples, which ranks share unequally.

torch.nn.SyncBatchNorm only runs on CUDA, so the reference is what it is defined to
equal: BatchNorm2d on the concatenated global batch, in one process. The C++ test runs
the same model with SyncBatchNorm under DistributedDataParallel with 1, 2 or 4 ranks,
each on its slice, and every rank must reproduce these numbers.

Model (names as nn.Sequential gives them):
  0 Conv2d(2, 4, 3, padding=1, bias=False)   (no bias: BatchNorm cancels it)
  1 BatchNorm2d(4)                           (momentum 0.1, eps 1e-5; non-default
                                              affine and running statistics)
  2 LeakyReLU(0.2)
  3 Conv2d(4, 1, 3)                          [8, 2, 5, 5] -> [8, 1, 3, 3]
Loss: mse_loss(out, target), the mean over all 8 * 9 outputs of the global batch.
Step: SGD(lr 0.1, momentum 0.9), one step (train mode).

Computed in float64 from float32-representable weights and inputs, stored as float32.
Output tests/golden/sync_bn_2rank.safetensors:
  "input.x" [8, 2, 5, 5], "input.target" [8, 1, 3, 3]   the global batch
  "split.<W>" (int64 [W])  the per-rank batch sizes for W = 1, 2, 4 ranks: rank r takes
                           the next split[r] samples (2 ranks: 3 and 5)
  "param.<name>"  the state dict before the step (parameters and buffers)
  "out.out" [8, 1, 3, 3], "out.loss" []
  "grad.<name>"   every parameter's gradient (of the global loss)
  "after.<name>"  the state dict after the step: updated weights and running statistics
Run: python3 tests/golden/make_sync_bn_golden.py
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
SPLITS = {1: [8], 2: [3, 5], 4: [1, 2, 2, 3]}
N = 8


def f32(t):
    """Rounds to float32 values, kept as float64."""
    return t.float().double()


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.LeakyReLU(0.2),
                          nn.Conv2d(4, 1, 3)).double()
    with torch.no_grad():
        bn = model[1]
        bn.weight.copy_(1 + 0.2 * torch.randn(4))
        bn.bias.copy_(0.2 * torch.randn(4))
        bn.running_mean.copy_(0.1 * torch.randn(4))
        bn.running_var.copy_(1 + 0.5 * torch.rand(4))
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                t.copy_(f32(t))
    # Channels off zero mean and unit variance, so the normalisation matters.
    x = f32(torch.randn(N, 2, 5, 5) * 1.5 + 0.3)
    target = f32(torch.randn(N, 1, 3, 3))

    out = {"input.x": x, "input.target": target}
    out.update({f"split.{w}": torch.tensor(s, dtype=torch.int64) for w, s in SPLITS.items()})
    out.update({f"param.{k}": v.detach().clone() for k, v in model.state_dict().items()})
    model.train()
    y = model(x)
    loss = F.mse_loss(y, target)
    out.update({"out.out": y.detach(), "out.loss": loss.detach()})
    loss.backward()
    out.update({f"grad.{k}": p.grad for k, p in model.named_parameters()})
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
    out.update({f"after.{k}": v.detach().clone() for k, v in model.state_dict().items()})
    tensors = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in out.items()}
    save_file(tensors, os.path.join(HERE, "sync_bn_2rank.safetensors"), metadata={"torch": torch.__version__})


if __name__ == "__main__":
    main()
