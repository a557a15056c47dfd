#include "engine/nn/attention.h"

#include <cmath>

#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/attention.h"
#include "engine/ops/dropout.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/matmul.h"
#include "engine/ops/softmax.h"

namespace nd::nn {

MultiheadAttentionImpl::MultiheadAttentionImpl(const MultiheadAttentionOptions& options_)
    : Module("MultiheadAttention"), options(options_) {
  const int64_t E = options.embed_dim(), H = options.num_heads();
  ND_CHECK(E > 0, "MultiheadAttention: embed_dim must be positive, got ", E);
  ND_CHECK(H > 0, "MultiheadAttention: num_heads must be positive, got ", H);
  ND_CHECK(E % H == 0, "MultiheadAttention: embed_dim must be divisible by num_heads, got embed_dim=", E,
           ", num_heads=", H);
  ND_CHECK(options.dropout() >= 0.0 && options.dropout() <= 1.0, "MultiheadAttention: dropout must be between 0 "
           "and 1, got ", options.dropout());
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * E, E}));
  if (options.bias()) in_proj_bias = register_parameter("in_proj_bias", empty({3 * E}));
  out_proj = register_module("out_proj", Linear(LinearOptions(E, E).bias(options.bias())));
  reset_parameters();
}

void MultiheadAttentionImpl::reset_parameters() {
  init::xavier_uniform_(in_proj_weight);
  if (in_proj_bias.defined()) {
    init::zeros_(in_proj_bias);
    init::zeros_(out_proj->bias);
  }
}

namespace {

// A PyTorch MHA mask as an additive one in `like`'s dtype and device: bool true (blocked)
// -> log(0) = -inf, false -> log(1) = 0, on the device; floating masks converted.
Tensor additive_mask(const Tensor& mask, const Tensor& like) {
  const Tensor m = mask.to(like.device());
  if (m.dtype() != kBool) return m.to(like.dtype());
  return log(eq(m, zeros_like(m)).to(like.dtype()));
}

// PyTorch's causal mask for L queries and S keys: key j blocked for query i when j > i.
Tensor causal_mask(int64_t L, int64_t S) {
  Tensor blocked = zeros({L, S}, TensorOptions(kBool));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = i + 1; j < S; ++j) blocked.data_ptr<bool>()[i * S + j] = true;
  return blocked;
}

}  // namespace

std::tuple<Tensor, Tensor> MultiheadAttentionImpl::forward(const Tensor& query, const Tensor& key,
                                                           const Tensor& value,
                                                           const MultiheadAttentionForwardArgs& args) {
  const int64_t E = options.embed_dim(), H = options.num_heads(), D = E / H;
  const bool batched = query.dim() == 3;
  ND_CHECK(query.dim() == 3 || query.dim() == 2, "MultiheadAttention: expected query [B, L, E], [L, B, E] or [L, E], "
           "got ", query.describe());
  ND_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), "MultiheadAttention: key ", key.describe(),
           " and value ", value.describe(), " must have query's number of dims (", query.dim(), ")");
  ND_CHECK(query.size(-1) == E && key.size(-1) == E && value.size(-1) == E, "MultiheadAttention: query, key and value "
           "must end in embed_dim=", E, ", got ", query.describe(), ", ", key.describe(), ", ", value.describe());
  // To [B, L, E].
  auto to_batch_first = [&](const Tensor& t) {
    if (!batched) return t.unsqueeze(0);
    return options.batch_first() ? t : t.transpose(0, 1);
  };
  const Tensor q_in = to_batch_first(query), k_in = to_batch_first(key), v_in = to_batch_first(value);
  const int64_t B = q_in.size(0), L = q_in.size(1), S = k_in.size(1);
  ND_CHECK(k_in.size(0) == B && v_in.size(0) == B && v_in.size(1) == S, "MultiheadAttention: query ",
           query.describe(), ", key ", key.describe(), " and value ", value.describe(),
           " disagree on batch size or key length");

  // Project, then split heads: [B, H, L, D]. Self-attention (query, key and value one
  // tensor, as PyTorch checks) is one linear with all of in_proj, its [B, L, 3E] result
  // viewed as q, k and v (one GEMM forward and one backward, instead of three with three
  // gradients summed); otherwise each input takes its q, k or v row block of in_proj.
  Tensor q, k, v;
  if (query.impl_ptr() == key.impl_ptr() && key.impl_ptr() == value.impl_ptr()) {
    const Tensor qkv = functional::linear(q_in, in_proj_weight, in_proj_bias).reshape({B, L, 3, H, D});
    q = qkv.select(2, 0).transpose(1, 2);
    k = qkv.select(2, 1).transpose(1, 2);
    v = qkv.select(2, 2).transpose(1, 2);
  } else {
    auto project = [&](const Tensor& x, int64_t block) {
      const Tensor w = in_proj_weight.narrow(0, block * E, E);
      const Tensor b = in_proj_bias.defined() ? in_proj_bias.narrow(0, block * E, E) : Tensor();
      const Tensor y = functional::linear(x, w, b);
      return y.reshape({B, y.size(1), H, D}).transpose(1, 2);
    };
    q = project(q_in, 0);
    k = project(k_in, 1);
    v = project(v_in, 2);
  }

  // The masks, in sdpa's [B, H, L, S] broadcast space. Only attn_mask, or is_causal alone
  // on the fused path, go to the kernel as they are; any combination is added as one
  // additive mask (PyTorch merges them the same way).
  Tensor attn_mask = args.attn_mask, padding = args.key_padding_mask;
  if (attn_mask.defined()) {
    ND_CHECK(attn_mask.dim() == 2 || attn_mask.dim() == 3, "MultiheadAttention: attn_mask must be [L, S] or "
             "[B * num_heads, L, S], got ", attn_mask.describe());
    ND_CHECK(attn_mask.size(-2) == L && attn_mask.size(-1) == S && (attn_mask.dim() == 2 || attn_mask.size(0) == B * H),
             "MultiheadAttention: expected attn_mask [L, S] = [", L, ", ", S, "] or [B * num_heads, L, S] = [", B * H,
             ", ", L, ", ", S, "], got ", attn_mask.describe());
    if (attn_mask.dim() == 3) attn_mask = attn_mask.reshape({B, H, L, S});
  }
  if (padding.defined()) {
    const Shape expected = batched ? Shape{B, S} : Shape{S};
    ND_CHECK(padding.sizes() == expected, "MultiheadAttention: expected key_padding_mask ", shape_str(expected),
             " ([batch, keys]), got ", padding.describe());
    padding = padding.reshape({B, 1, 1, S});
  }
  const bool kernel_causal = args.is_causal && !attn_mask.defined() && !padding.defined() && !args.need_weights;
  if (args.is_causal && !attn_mask.defined() && !kernel_causal) attn_mask = causal_mask(L, S);
  const double dropout_p = is_training() ? options.dropout() : 0.0;
  Tensor heads, weights;
  if (args.need_weights) {
    // softmax(q k^T / sqrt(D) + masks), dropout, then P v, as PyTorch's need_weights path.
    // The dropout is nd::dropout on the dense [B, H, L, S] weights: the elements the fused
    // kernel would drop for the same generator state (kernels/common/dropout_mask.h).
    Tensor scores = matmul(q, k.transpose(-2, -1)).mul(1.0 / std::sqrt(static_cast<double>(D)));
    for (const Tensor& m : {attn_mask, padding})
      if (m.defined()) scores = add(scores, additive_mask(m, q));
    weights = dropout(softmax(scores, -1), dropout_p, dropout_p > 0.0);
    heads = matmul(weights, v);
    if (args.average_attn_weights) weights = weights.mean({1});
    if (!batched) weights = weights.squeeze(0);
  } else {
    Tensor mask;  // sdpa's: bool true = attend, or additive
    if (attn_mask.defined() && padding.defined()) {
      mask = add(additive_mask(attn_mask, q), additive_mask(padding, q));
    } else if (const Tensor& one = attn_mask.defined() ? attn_mask : padding; one.defined()) {
      mask = one.dtype() == kBool ? eq(one, zeros_like(one)) : one.to(q.dtype());
    }
    heads = scaled_dot_product_attention(q, k, v, mask, dropout_p, kernel_causal);
  }
  Tensor out = out_proj->forward(heads.transpose(1, 2).reshape({B, L, E}));
  if (!batched) out = out.squeeze(0);
  else if (!options.batch_first()) out = out.transpose(0, 1);
  return {out, weights};
}

}  // namespace nd::nn
