#pragma once
// nn::MultiheadAttention on nd::scaled_dot_product_attention, with PyTorch's
// parameter names: in_proj_weight [3E, E] (q, k, v rows stacked), in_proj_bias [3E],
// out_proj.weight [E, E], out_proj.bias [E] (out_proj is a child Linear).
// Tests: tests/nn/layers_test.cpp, golden_test.cpp.
#include "engine/nn/init.h"
#include "engine/nn/linear.h"
#include "engine/nn/module.h"

namespace nd::nn {

struct MultiheadAttentionOptions {
  MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  ND_ARG(int64_t, embed_dim);
  ND_ARG(int64_t, num_heads);
  // Attention dropout is not implemented: only 0 is accepted.
  ND_ARG(double, dropout) = 0.0;
  ND_ARG(bool, bias) = true;
  // true: inputs are [B, L, E]; false (PyTorch's default): [L, B, E].
  ND_ARG(bool, batch_first) = false;
};

// Init (PyTorch's _reset_parameters): in_proj_weight xavier_uniform_, in_proj_bias and
// out_proj.bias zeros, out_proj.weight as any Linear (kaiming_uniform_(a = sqrt(5))).
class MultiheadAttentionImpl : public Module {
 public:
  explicit MultiheadAttentionImpl(const MultiheadAttentionOptions& options);
  MultiheadAttentionImpl(int64_t embed_dim, int64_t num_heads)
      : MultiheadAttentionImpl(MultiheadAttentionOptions(embed_dim, num_heads)) {}
  void reset_parameters();

  // query [B, L, E] (batch_first) or [L, B, E], or unbatched [L, E]; key, value with S
  // in place of L. Returns the attention output, shaped like query.
  // attn_mask as in PyTorch: [L, S] or [B * num_heads, L, S]; bool true = NOT allowed to
  //   attend, or floating point added to the scores.
  // is_causal: query i attends keys j <= i (instead of attn_mask, not with it).
  // need_weights = true is not supported (the fused kernel never forms the weights).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask = {},
                 bool need_weights = false, bool is_causal = false);
  // Self-attention: forward(x, x, x).
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }

  MultiheadAttentionOptions options;
  Tensor in_proj_weight, in_proj_bias;
  Linear out_proj;
};
ND_MODULE(MultiheadAttention);

}  // namespace nd::nn
