#!/usr/bin/env python3
"""Writes the safetensors golden files that tests/io/checkpoint_interop_test.cpp
reads: checkpoints as Python's `safetensors` package and PyTorch write them.

Values follow closed forms that the C++ test recomputes (all exact in every dtype):
  floats: v[i] = (i % 17) * 0.25 - 2      ints: v[i] = 3 * i - 7      u8: v[i] = (37 * i) % 256
  bool:   v[i] = (i % 3 == 0)             i64 element 0 is 2**62 + 1 (not representable in f64)
Run from anywhere: python3 tests/golden/make_safetensors_golden.py (needs torch, numpy, safetensors).
"""
import os

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file as save_torch

HERE = os.path.dirname(os.path.abspath(__file__))


def floats(shape, dtype):
    n = int(np.prod(shape))
    return torch.tensor([(i % 17) * 0.25 - 2 for i in range(n)], dtype=torch.float64).to(dtype).reshape(shape)


def ints(shape, dtype):
    n = int(np.prod(shape))
    return torch.tensor([3 * i - 7 for i in range(n)], dtype=torch.int64).to(dtype).reshape(shape)


def main():
    # A PyTorch state dict: module-style names, every dtype nanoddp reads, a 0-d tensor,
    # an empty tensor; torch orders the data by dtype alignment, not by name.
    big = ints([5], torch.int64)
    big[0] = 2**62 + 1
    state = {
        "main.0.weight": floats([4, 3, 2, 2], torch.float32),
        "main.0.bias": floats([4], torch.float32),
        "main.1.running_mean": floats([4], torch.float64),
        "main.1.num_batches_tracked": torch.tensor(12345, dtype=torch.int64),
        "half.bf16": floats([3, 5], torch.bfloat16),
        "half.f16": floats([2, 7], torch.float16),
        "int.i64": big,
        "int.i32": ints([2, 3], torch.int32),
        "int.u8": torch.tensor([(37 * i) % 256 for i in range(10)], dtype=torch.uint8),
        "mask": torch.tensor([i % 3 == 0 for i in range(7)], dtype=torch.bool),
        "empty": torch.zeros([0, 3], dtype=torch.float32),
    }
    save_torch(state, os.path.join(HERE, "torch_state_dict.safetensors"), metadata={"format": "pt", "step": "7"})

    # The same through safetensors.numpy (no bf16 in numpy), without metadata.
    arrays = {k: v.numpy() for k, v in state.items() if v.dtype != torch.bfloat16}
    save_numpy(arrays, os.path.join(HERE, "numpy_arrays.safetensors"))


if __name__ == "__main__":
    main()
