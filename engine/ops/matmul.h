#pragma once
// Matrix products with PyTorch semantics. Kernels: kernels/cpu/matmul.h.
// Tests: tests/ops/matmul_test.cpp.
#include "engine/anomaly_mode.h"
#include "engine/tensor.h"

namespace nd {

// [n, m] x [m, p] -> [n, p]. Backward node: MmBackward.
Tensor mm(const Tensor& mat1, const Tensor& mat2, autograd::CallSite = {});
// input + mat1 mat2 with input broadcast to [n, p] (a Linear's bias [p]); the product is
// accumulated onto the copied input. Backward node: AddmmBackward.
Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2, autograd::CallSite = {});
// [B, n, m] x [B, m, p] -> [B, n, p]. Backward node: BmmBackward.
Tensor bmm(const Tensor& batch1, const Tensor& batch2, autograd::CallSite = {});
// torch.matmul: 1-D x 1-D is a dot product (0-d result); 2-D x 2-D is mm; a 1-D
// operand gets a dimension prepended (left) or appended (right) that is removed from
// the result; otherwise batched over the leading dimensions, which broadcast.
// Member: x.matmul(y).
Tensor matmul(const Tensor& a, const Tensor& b, autograd::CallSite = {});

}  // namespace nd
