#pragma once
// Loss functions with PyTorch semantics (LibTorch: torch::mse_loss,
// torch::binary_cross_entropy_with_logits, torch::cross_entropy_loss / F::cross_entropy).
// Backward nodes: MseLossBackward, BinaryCrossEntropyWithLogitsBackward and a fused
// CrossEntropyBackward (log_softmax + nll_loss in one node, saving the rows' logsumexp).
#include "engine/anomaly_mode.h"
#include "engine/tensor.h"

namespace nd {

// None: one loss per element (input's shape); Mean / Sum: a 0-d tensor.
enum class Reduction { None, Mean, Sum };

// l = (input - target)^2.  requires: target of input's shape and dtype.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                autograd::CallSite = {});

// l = weight * [(1 - t) x + lw * log(1 + exp(-x))], lw = 1 + (pos_weight - 1) t, computed
// without overflow. requires: target of input's shape; weight broadcastable to input;
// pos_weight of shape [input.size(-1)] (or one element). No gradient flows to weight or
// pos_weight (they must not require grad).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const Tensor& weight = {},
                                        const Tensor& pos_weight = {}, Reduction reduction = Reduction::Mean,
                                        autograd::CallSite = {});

// input [N, C], [C] or [N, C, d1, ...] logits; target int64 class indices [N], [] or
// [N, d1, ...]. Per sample, with eps = label_smoothing and w = weight (ones if undefined):
//   l = (1 - eps) w_y (logsumexp(x) - x_y) + eps / C * sum_c w_c (logsumexp(x) - x_c)
// and l = 0 where target == ignore_index. Mean divides by the sum of w_y over the samples
// that are not ignored (PyTorch's weighted mean).
// target may instead hold class probabilities (soft labels): input's shape and dtype. Then
// l = -sum_c w_c t'_c log_softmax(x)_c with t' = (1 - eps) t + eps / C; Mean divides by the
// number of samples; ignore_index is an error; the target gets a gradient too.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight = {},
                     Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, autograd::CallSite = {});

}  // namespace nd
