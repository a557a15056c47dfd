#pragma once
// nn::MultiheadAttention on nd::scaled_dot_product_attention, with PyTorch's
// parameter names: in_proj_weight [3E, E] (q, k, v rows stacked), in_proj_bias [3E],
// out_proj.weight [E, E], out_proj.bias [E] (out_proj is a child Linear).
// Tests: tests/nn/layers_test.cpp, golden_test.cpp.
#include <tuple>

#include "engine/nn/init.h"
#include "engine/nn/linear.h"
#include "engine/nn/module.h"

namespace nd::nn {

struct MultiheadAttentionOptions {
  MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  ND_ARG(int64_t, embed_dim);
  ND_ARG(int64_t, num_heads);
  // Dropout on the attention weights, in training mode only.
  ND_ARG(double, dropout) = 0.0;
  ND_ARG(bool, bias) = true;
  // true: inputs are [B, L, E]; false (PyTorch's default): [L, B, E].
  ND_ARG(bool, batch_first) = false;
};

// forward's optional arguments: PyTorch's keyword arguments of nn.MultiheadAttention.forward,
// in its order, for designated initializers, through forward or the holder's call operator:
//   auto [out, weights] = mha(q, k, v, {.key_padding_mask = pad, .need_weights = true});
// LibTorch's positional form works too: mha->forward(q, k, v, pad, true, mask, false).
struct MultiheadAttentionForwardArgs {
  // [B, S] (or [S] for unbatched inputs): bool true = ignore that key, or floating point
  // added to the scores.
  Tensor key_padding_mask{};
  // Also return the attention weights (after dropout, as PyTorch's). Computes them
  // explicitly (softmax of an [B, H, L, S] tensor); false keeps the fused kernel, which never
  // forms them. PyTorch's default is true; ours is the fast path.
  bool need_weights = false;
  // [L, S] or [B * num_heads, L, S]: bool true = NOT allowed to attend, or floating point
  // added to the scores. Combined with key_padding_mask by adding (bool masks as -inf).
  Tensor attn_mask{};
  // With need_weights: the weights averaged over heads [B, L, S] (true) or per head [B, H, L, S].
  bool average_attn_weights = true;
  // Query i attends keys j <= i. Without attn_mask it builds that mask (PyTorch needs the mask
  // as well and takes is_causal as a hint); with attn_mask, the mask is used as given.
  bool is_causal = false;
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
  // in place of L. Returns (attn_output shaped like query, attn_output_weights): the
  // weights are undefined unless args.need_weights, then [B, L, S] averaged over heads or
  // [B, H, L, S] (unbatched: without B). A query whose keys are all masked gets a zero
  // output on the fused path and NaN weights and output on the need_weights path (softmax
  // over no key), as PyTorch's.
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const MultiheadAttentionForwardArgs& args = {});
  // LibTorch's positional overload (its defaults: need_weights true), so a port compiles as
  // written; from key_padding_mask on (without it, the call above is meant).
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const Tensor& key_padding_mask, bool need_weights = true,
                                     const Tensor& attn_mask = {}, bool average_attn_weights = true) {
    return forward(query, key, value,
                   MultiheadAttentionForwardArgs{.key_padding_mask = key_padding_mask,
                                                 .need_weights = need_weights,
                                                 .attn_mask = attn_mask,
                                                 .average_attn_weights = average_attn_weights});
  }
  // Self-attention: the output of forward(x, x, x).
  Tensor forward(const Tensor& x) override { return std::get<0>(forward(x, x, x)); }

  MultiheadAttentionOptions options;
  Tensor in_proj_weight, in_proj_bias;
  Linear out_proj;
};
// The holder, whose call operator also takes the arguments struct as a braced list:
// mha(q, k, v, {.attn_mask = mask}) (the generic one cannot deduce a braced list).
class MultiheadAttention : public ModuleHolder<MultiheadAttentionImpl> {
 public:
  using ModuleHolder<MultiheadAttentionImpl>::ModuleHolder;
  using ModuleHolder<MultiheadAttentionImpl>::operator();
  std::tuple<Tensor, Tensor> operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                        const MultiheadAttentionForwardArgs& args) const {
    return get()->forward(query, key, value, args);
  }
};

}  // namespace nd::nn
