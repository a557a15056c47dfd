#!/usr/bin/env python3
"""Golden values for tests/nn/golden_test.cpp, computed by PyTorch (the oracle; nanoddp
never depends on it). For each layer: fixed (seeded) weights, a fixed input, forward,
backward of sum(out * grad_out), and every parameter and input gradient.

Computed in float64 from float32-representable values, so the C++ f32 results are
compared with an exact reference. Output: nn_<case>.txt, one tensor per line:
    name|d0,d1,...|v0 v1 ...        (empty shape field = 0-d tensor)
Keys "param.<name>" are loaded with load_state_dict, "input.<name>" are inputs,
"grad.<name>" gradients, "out" / "grad_out" the output and the gradient fed back,
"after.<name>" buffers after the forward. Run: python3 tests/golden/make_nn_golden.py
"""
import os

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))


def f32(t):
    """Rounds to float32 values, kept as float64."""
    return t.float().double()


def write(case, tensors):
    with open(os.path.join(HERE, f"nn_{case}.txt"), "w") as f:
        f.write(f"# nanoddp golden: {case} (tests/golden/make_nn_golden.py, torch {torch.__version__})\n")
        for name, t in tensors.items():
            t = t.detach().double().reshape(-1) if t.dim() else t.detach().double().reshape(1)
            shape = ",".join(str(d) for d in tensors[name].shape)
            f.write(f"{name}|{shape}|" + " ".join(f"{v:.9g}" for v in t.tolist()) + "\n")


def run(case, module, inputs, call=None, after=()):
    """inputs: name -> tensor (float inputs get gradients); call(module, inputs) -> out."""
    module = module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(f32(p))
    params = {f"param.{k}": v.detach().clone() for k, v in module.state_dict().items()}
    ins = {k: (f32(v).requires_grad_() if v.is_floating_point() else v) for k, v in inputs.items()}
    out = call(module, ins) if call else module(*ins.values())
    grad_out = f32(torch.randn_like(out))
    (out * grad_out).sum().backward()
    tensors = dict(params)
    tensors.update({f"input.{k}": v for k, v in ins.items()})
    tensors["out"] = out
    tensors["grad_out"] = grad_out
    tensors.update({f"grad.{k}": p.grad for k, p in module.named_parameters()})
    tensors.update({f"grad.{k}": v.grad for k, v in ins.items() if v.is_floating_point() and v.grad is not None})
    tensors.update({f"after.{k}": module.state_dict()[k] for k in after})
    write(case, tensors)


def main():
    torch.manual_seed(0)
    run("linear", nn.Linear(5, 3), {"x": torch.randn(2, 4, 5)})
    run("conv2d", nn.Conv2d(4, 4, 3, stride=2, padding=2, dilation=2, groups=2), {"x": torch.randn(2, 4, 5, 5)})
    run("conv_transpose2d", nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2),
        {"x": torch.randn(2, 4, 2, 2)})

    bn = nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        bn.weight.copy_(torch.randn(3))
        bn.bias.copy_(torch.randn(3))
        bn.running_mean.copy_(f32(torch.randn(3)))
        bn.running_var.copy_(f32(torch.rand(3) + 0.5))
        bn.num_batches_tracked.fill_(5)
    run("batch_norm2d", bn, {"x": torch.randn(3, 3, 2, 3) * 2 + 1},
        after=("running_mean", "running_var", "num_batches_tracked"))

    ln = nn.LayerNorm([4, 5])
    with torch.no_grad():
        ln.weight.copy_(torch.randn(4, 5))
        ln.bias.copy_(torch.randn(4, 5))
    run("layer_norm", ln, {"x": torch.randn(3, 4, 5)})

    # Cross-attention, batch_first, PyTorch's bool mask (True = blocked).
    mha = nn.MultiheadAttention(4, 2, batch_first=True)
    with torch.no_grad():
        mha.in_proj_bias.copy_(torch.randn(12) * 0.1)
        mha.out_proj.bias.copy_(torch.randn(4) * 0.1)
    mask = torch.tensor([[False, True, False, False], [False, False, True, True], [True, False, False, False]])
    run("mha", mha, {"q": torch.randn(2, 3, 4), "k": torch.randn(2, 4, 4), "v": torch.randn(2, 4, 4),
                     "mask": mask},
        call=lambda m, i: m(i["q"], i["k"], i["v"], attn_mask=i["mask"], need_weights=False)[0])

    # Causal self-attention, sequence first [L, B, E] (C++ passes is_causal instead of the mask).
    mha = nn.MultiheadAttention(4, 2)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    run("mha_causal", mha, {"x": torch.randn(5, 2, 4)},
        call=lambda m, i: m(i["x"], i["x"], i["x"], attn_mask=causal, need_weights=False)[0])

    # key_padding_mask (bool, True = padding) merged with a float attn_mask, batch_first.
    mha = nn.MultiheadAttention(4, 2, batch_first=True)
    pad = torch.tensor([[False, False, False, True, True], [False, True, False, False, False]])
    run("mha_padding", mha, {"q": torch.randn(2, 3, 4), "k": torch.randn(2, 5, 4), "v": torch.randn(2, 5, 4),
                             "pad": pad, "bias": torch.randn(3, 5)},
        call=lambda m, i: m(i["q"], i["k"], i["v"], key_padding_mask=i["pad"], attn_mask=i["bias"].detach(),
                            need_weights=False)[0])

    # need_weights: output and head-averaged weights (out is both, flattened and joined, so
    # the gradient reaches the module through each), float key_padding_mask, sequence first.
    def out_and_weights(out, weights):
        return torch.cat([out.reshape(-1), weights.reshape(-1)])

    mha = nn.MultiheadAttention(4, 2)
    fpad = torch.tensor([[0.0, -1.5, 0.0, float("-inf")], [0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    run("mha_weights", mha, {"q": torch.randn(3, 2, 4), "kv": torch.randn(4, 2, 4), "pad": fpad},
        call=lambda m, i: out_and_weights(*m(i["q"], i["kv"], i["kv"], key_padding_mask=i["pad"].detach(),
                                             need_weights=True, average_attn_weights=True)))

    # Per-head weights with a 3-D bool attn_mask [B * H, L, S], batch_first.
    mha = nn.MultiheadAttention(6, 3, batch_first=True)
    mask3 = torch.rand(2 * 3, 4, 5) < 0.3
    mask3[:, :, 0] = False  # every query keeps a key
    run("mha_weights_per_head", mha, {"x": torch.randn(2, 4, 6), "kv": torch.randn(2, 5, 6), "mask": mask3},
        call=lambda m, i: out_and_weights(*m(i["x"], i["kv"], i["kv"], attn_mask=i["mask"], need_weights=True,
                                             average_attn_weights=False)))

    # Unbatched [L, E] self-attention, causal with a key_padding_mask [S] (PyTorch takes the
    # causal mask and is_causal as its hint; C++ passes is_causal alone), with weights.
    mha = nn.MultiheadAttention(4, 2)
    causal4 = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    run("mha_causal_padding", mha, {"x": torch.randn(4, 4), "pad": torch.tensor([False, False, True, False])},
        call=lambda m, i: out_and_weights(*m(i["x"], i["x"], i["x"], key_padding_mask=i["pad"], attn_mask=causal4,
                                             is_causal=True, need_weights=True)))


if __name__ == "__main__":
    main()
