#pragma once
// softmax / log_softmax along any dimension (LibTorch: torch::softmax, torch::log_softmax).
// Also Tensor::softmax and Tensor::log_softmax. Backward nodes: SoftmaxBackward,
// LogSoftmaxBackward (both save only the output).
#include "engine/anomaly_mode.h"
#include "engine/tensor.h"

namespace nd {

// y = exp(x - max) / sum exp(x - max) along `dim` (negative counts from the end).
Tensor softmax(const Tensor& x, int64_t dim, autograd::CallSite = {});
// y = x - max - log sum exp(x - max) along `dim`.
Tensor log_softmax(const Tensor& x, int64_t dim, autograd::CallSite = {});

}  // namespace nd
