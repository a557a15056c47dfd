#pragma once
// scaled_dot_product_attention (LibTorch: torch::scaled_dot_product_attention), flash-style
// on the CPU: no [L, S] matrix is materialised. Backward node:
// ScaledDotProductAttentionBackward (saves q, k, v, out and the rows' logsumexp).
#include <optional>

#include "engine/tensor.h"

namespace nd {

// out = softmax(q k^T * scale + mask) v, per batch and head.
// requires: q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev] (or all 3-D, [B, L, E], ...);
//   attn_mask undefined, or bool (true = attend) / floating (added to the scores),
//   broadcastable to [B, H, L, S], and not requiring grad;
//   dropout_p in [0, 1]: each attention weight P_ij is dropped with that probability and
//     the kept ones scaled by 1 / (1 - p), whatever the mode (pass 0 in eval, as with
//     PyTorch's); the mask is drawn from the default generator (nd::manual_seed makes it
//     reproducible) and replayed by the backward;
//   is_causal: query i attends keys j <= i (top-left aligned), not together with attn_mask;
//   scale: defaults to 1/sqrt(E).
// A query whose keys are all masked gets a zero output (and no gradient).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

}  // namespace nd
