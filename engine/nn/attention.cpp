#include "engine/nn/attention.h"

#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/attention.h"
#include "engine/ops/elementwise.h"

namespace nd::nn {

MultiheadAttentionImpl::MultiheadAttentionImpl(const MultiheadAttentionOptions& options_)
    : Module("MultiheadAttention"), options(options_) {
  const int64_t E = options.embed_dim(), H = options.num_heads();
  ND_CHECK(E > 0, "MultiheadAttention: embed_dim must be positive, got ", E);
  ND_CHECK(H > 0, "MultiheadAttention: num_heads must be positive, got ", H);
  ND_CHECK(E % H == 0, "MultiheadAttention: embed_dim must be divisible by num_heads, got embed_dim=", E,
           ", num_heads=", H);
  ND_CHECK(options.dropout() == 0.0, "MultiheadAttention: dropout=", options.dropout(),
           " is not supported (attention dropout is not implemented); use 0");
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

Tensor MultiheadAttentionImpl::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                       const Tensor& attn_mask, bool need_weights, bool is_causal) {
  ND_CHECK(!need_weights, "MultiheadAttention: need_weights=true is not supported (the fused attention never "
           "forms the weights); pass need_weights=false");
  ND_CHECK(!(is_causal && attn_mask.defined()), "MultiheadAttention: pass either attn_mask or is_causal, not both");
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

  Tensor mask;
  if (attn_mask.defined()) {
    ND_CHECK(attn_mask.dim() == 2 || attn_mask.dim() == 3, "MultiheadAttention: attn_mask must be [L, S] or "
             "[B * num_heads, L, S], got ", attn_mask.describe());
    // PyTorch's MHA bool mask marks positions to block; sdpa's marks positions to keep.
    mask = attn_mask.dtype() == kBool ? eq(attn_mask, zeros_like(attn_mask)) : attn_mask;
    if (mask.dim() == 3) {
      ND_CHECK(mask.size(0) == B * H, "MultiheadAttention: a 3-D attn_mask must be [B * num_heads, L, S] = [", B * H,
               ", ", L, ", ", S, "], got ", attn_mask.describe());
      mask = mask.reshape({B, H, mask.size(1), mask.size(2)});
    }
  }
  const Tensor heads = scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal);
  Tensor out = out_proj->forward(heads.transpose(1, 2).reshape({B, L, E}));
  if (!batched) return out.squeeze(0);
  return options.batch_first() ? out : out.transpose(0, 1);
}

}  // namespace nd::nn
