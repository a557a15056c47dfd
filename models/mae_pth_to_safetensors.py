#!/usr/bin/env python3
"""Converts a facebookresearch/mae checkpoint (.pth) into a safetensors file that
nd::models::MAE or MAEEncoder loads (docs/models.md, "Loading the released checkpoints"):

  python3 models/mae_pth_to_safetensors.py mae_pretrain_vit_base.pth mae_vit_base.safetensors

The checkpoint is read with torch.load(weights_only=True): tensors, containers and the
argparse.Namespace that main_pretrain.py saves as "args", nothing that runs code. Its
"model" entry (or the file itself, when it is a bare state dict) is written tensor for
tensor under the same keys, a DDP "module." prefix stripped, each contiguous in its own
dtype. The tool prints which of models_mae.py's configs the shapes match and whether the
decoder is there: the released pretrain checkpoints hold the encoder alone
(MAEEncoder::load_encoder_state_dict loads them), full ones load into MAE with strict
loading as well. Needs torch and safetensors (pip install torch safetensors).
Exit status: 0 on success, 1 when the input cannot be read or holds no MAE state dict.
"""
import argparse
import os
import re
import sys

# models_mae.py's named configs: (patch size, embed dim, depth) -> name.
CONFIGS = {(16, 768, 12): "mae_vit_base_patch16_dec512d8b", (16, 1024, 24): "mae_vit_large_patch16_dec512d8b",
           (14, 1280, 32): "mae_vit_huge_patch14_dec512d8b"}


def fail(message):
    print(f"mae_pth_to_safetensors: {message}", file=sys.stderr)
    sys.exit(1)


def read_state_dict(path, torch):
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([argparse.Namespace])
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (any reason the file is unreadable is reported the same way)
        fail(f"cannot read {path} as a PyTorch checkpoint: {e}")
    state = checkpoint.get("model", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not state or not all(torch.is_tensor(v) for v in state.values()):
        found = sorted(checkpoint.keys()) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        fail(f"{path} holds no state dict of tensors (expected a dict with a 'model' state dict, found {found})")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}


def describe(state):
    """'mae_vit_base_patch16_dec512d8b (encoder and decoder)', or the shapes when no config fits."""
    if "patch_embed.proj.weight" not in state:
        fail("no 'patch_embed.proj.weight' in the state dict: not a models_mae.py MaskedAutoencoderViT")
    embed, _, patch, _ = state["patch_embed.proj.weight"].shape
    depth = len({m.group(1) for k in state for m in [re.match(r"blocks\.(\d+)\.", k)] if m})
    decoder = "mask_token" in state or any(k.startswith("decoder_") for k in state)
    name = CONFIGS.get((patch, embed, depth), f"patch {patch}, embed_dim {embed}, depth {depth}")
    return f"{name} ({'encoder and decoder' if decoder else 'encoder only'})"


def main():
    parser = argparse.ArgumentParser(description="facebookresearch/mae .pth -> safetensors for nd::models::MAE")
    parser.add_argument("input", help="the .pth checkpoint (main_pretrain.py's, or a released one)")
    parser.add_argument("output", help="the .safetensors file to write")
    args = parser.parse_args()
    if not os.path.isfile(args.input):
        fail(f"{args.input}: no such file")
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as e:
        fail(f"needs torch and safetensors ({e}); pip install torch safetensors")
    state = read_state_dict(args.input, torch)
    what = describe(state)
    save_file({k: v.contiguous() for k, v in state.items()}, args.output,
              metadata={"source": os.path.basename(args.input), "format": "pt"})
    print(f"{args.output}: {len(state)} tensors, {what}")


if __name__ == "__main__":
    main()
