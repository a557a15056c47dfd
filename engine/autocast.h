#pragma once
// Mixed precision: PyTorch's autocast, reduced to what our kernels can use. While an
// AutocastGuard lives on this thread, these ops on f32 tensors of its device type take
// operands rounded to its dtype (bf16 by default, or f16) with f32 accumulation and
// return f32 (below, "bf16" stands for the guard's dtype; f16 is handled the same way on
// f16 tensor cores):
//   - GEMMs: mm, addmm, bmm, matmul, and so Linear and MultiheadAttention's projections
//     (CUDA: cuBLAS bf16 tensor cores; CPU: an f32 GEMM of the rounded operands, exact
//     products); addmm's added input (Linear's bias) stays f32, engine/ops/matmul.cpp;
//   - conv2d and conv_transpose2d, forward, dgrad and wgrad (CUDA: the implicit GEMM's
//     mma.sync tensor-core twin, kernels/cuda/conv.h ConvOperands::kBf16; CPU: the f32 kernels
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
// f16 keeps 3 more mantissa bits than bf16 but only 5 exponent bits: gradients under 6e-8
// round to 0 in the backward's f16 operands and values over 65504 to inf. Train with
// optim::GradScaler (engine/optim/grad_scaler.h), which scales the loss so that gradients
// fit and skips the steps that overflowed, as PyTorch's f16 autocast needs its GradScaler.
// Not covered: reduced-precision activations (no memory saving).
// Tests: tests/ops/autocast_test.cpp (GEMMs), autocast_conv_test.cpp,
// autocast_attention_test.cpp; tests/cuda/cuda_ops_test.cpp, cuda_conv_test.cpp,
// cuda_attention_test.cpp (CUDA against the CPU).
#include "engine/device.h"
#include "engine/dtype.h"

namespace nd {

class Tensor;

class AutocastGuard {
 public:
  // dtype: kBFloat16 or kFloat16 (anything else is an nd::Error), as torch.autocast's dtype.
  explicit AutocastGuard(DeviceType device_type, bool enabled = true, ScalarType dtype = kBFloat16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool previous_;
  ScalarType previous_dtype_;
};

// Whether autocast is on for tensors of `device_type` on this thread.
bool is_autocast_enabled(DeviceType device_type);
// The operand dtype of autocast for `device_type` on this thread (kBFloat16 or kFloat16).
ScalarType autocast_dtype(DeviceType device_type);

// Whether the ops listed above take bf16-rounded operands for input t: t is f32 and autocast
// is on for its device type.
bool autocast_applies(const Tensor& t);

}  // namespace nd
