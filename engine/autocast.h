#pragma once
// Mixed precision: PyTorch's autocast, reduced to what our kernels can use. While an
// AutocastGuard lives on this thread, these ops on f32 tensors of its device type take
// bf16-rounded operands with f32 accumulation and return f32:
//   - GEMMs: mm, addmm, bmm, matmul, and so Linear and MultiheadAttention's projections
//     (CUDA: cuBLAS bf16 tensor cores; CPU: an f32 GEMM of the rounded operands, exact
//     products); addmm's added input (Linear's bias) stays f32, engine/ops/matmul.cpp;
//   - conv2d and conv_transpose2d, forward, dgrad and wgrad (CUDA: the implicit GEMM's
//     WMMA tensor-core twin, kernels/cuda/conv.h ConvOperands::kBf16; CPU: the f32 kernels
//     on rounded copies); the bias and its gradient stay f32, engine/ops/conv.cpp;
//   - scaled_dot_product_attention: q, k, v, a floating mask and, in the backward, dout
//     rounded to bf16, out, dq, dk, dv rounded to bf16, logsumexp f32 (CUDA: the bf16
//     flash kernels on tensor cores, which also round P and dS; CPU: the f32 kernel at
//     those rounding points), engine/ops/attention.cpp.
// Their backward runs in the precision the forward did (decided when the forward ran, as
// in PyTorch, where the backward of a bf16 product is a bf16 product), even outside the
// guard. Everything else (layer_norm, softmax, batch_norm, losses, elementwise ops) runs
// in f32, as PyTorch's autocast keeps layer_norm, softmax and losses in f32; so
// parameters, activations and gradients stay f32: the optimizers update f32 master
// weights, DDP reduces f32 gradients. The CPU path is the reference the CUDA path is
// tested against; it is slower than plain f32 and exists for tests and for --amp runs
// without a GPU.
// Not covered: bf16 activations (no memory saving), f16 with loss scaling.
// Tests: tests/ops/autocast_test.cpp (GEMMs), autocast_conv_test.cpp,
// autocast_attention_test.cpp; tests/cuda/cuda_ops_test.cpp, cuda_conv_test.cpp,
// cuda_attention_test.cpp (CUDA against the CPU).
#include "engine/device.h"

namespace nd {

class Tensor;

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

// Whether the ops listed above take bf16-rounded operands for input t: t is f32 and autocast
// is on for its device type.
bool autocast_applies(const Tensor& t);

}  // namespace nd
