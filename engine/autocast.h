#pragma once
// Mixed precision: PyTorch's autocast, reduced to what our kernels can use. While an
// AutocastGuard lives on this thread, the GEMM ops on f32 tensors of its device type
// (mm, bmm, matmul, and so Linear and MultiheadAttention's projections) multiply
// bf16-rounded operands with f32 accumulation and return f32; their backward does the
// same (decided when the forward ran, as in PyTorch, where the backward of a bf16
// product is a bf16 product). Parameters, activations and gradients stay f32: the
// optimizers update f32 master weights, DDP reduces f32 gradients.
//   CUDA: the products run on bf16 tensor cores (cuBLAS, operands converted to bf16).
//   CPU:  the same numbers from an f32 GEMM of the rounded operands (bf16 x bf16
//         products are exact in f32), which is the reference the CUDA path is tested
//         against; it is slower than plain f32 and exists for tests and for --amp runs
//         without a GPU.
// Not covered yet: conv2d, conv_transpose2d and attention (their own kernels have no
// bf16 tensor-core path), and bf16 activations (no memory saving).
// Test: tests/ops/autocast_test.cpp, tests/cuda/cuda_ops_test.cpp.
#include "engine/device.h"

namespace nd {

class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device_type, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool previous_;
};

// Whether autocast is on for tensors of `device_type` on this thread.
bool is_autocast_enabled(DeviceType device_type);

}  // namespace nd
