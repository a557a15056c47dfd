// scaled_dot_product_attention op: gradcheck table (masks, causal, 3-D and 4-D),
// comparison with an explicit full score matrix, argument errors.
#include <cmath>
#include <limits>

#include "engine/ops/attention.h"
#include "engine/ops/dropout.h"
#include "engine/ops/matmul.h"
#include "engine/ops/softmax.h"
#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

namespace {

// out = softmax(scale q k^T + mask) v for one [L, E] x [S, E] x [S, Ev] head, written out
// with the full L x S matrix. mask_fn(i, j) is the additive mask.
template <class MaskFn>
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int64_t heads, int64_t L, int64_t S, int64_t E,
                                    int64_t Ev, double scale, MaskFn mask_fn) {
  std::vector<double> out(heads * L * Ev, 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> p(S);
      double mx = -std::numeric_limits<double>::infinity(), z = 0;
      for (int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += q[(h * L + i) * E + e] * k[(h * S + j) * E + e];
        p[j] = scale * s + mask_fn(h, i, j);
        mx = std::max(mx, p[j]);
      }
      for (int64_t j = 0; j < S; ++j) z += (p[j] = std::exp(p[j] - mx));
      for (int64_t j = 0; j < S; ++j)
        for (int64_t e = 0; e < Ev; ++e) out[(h * L + i) * Ev + e] += p[j] / z * v[(h * S + j) * Ev + e];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("attention: gradcheck table (f64, non-contiguous, batch size 1)") {
  using V = std::vector<Tensor>;
  const Tensor float_mask = nd::testing::random_input({3, 5}, 99, false, -2, 1);
  // Bool mask [B, 1, L, S] broadcast over heads; row (0, 0, 1) keeps only key 2.
  Tensor bool_mask = nd::testing::random_input({2, 1, 3, 5}, 98).gt(-0.5);
  {
    NoGradGuard g;
    Tensor row = bool_mask.select(0, 0).select(0, 0).select(0, 1);
    for (int64_t j = 0; j < 5; ++j) row.data_ptr<bool>()[j * row.stride(0)] = j == 2;
  }
  const std::vector<OpCase> cases = {
      {"sdpa 4-D", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}},
       [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, -2, 2},
      {"sdpa causal L > S", {{1, 2, 6, 3}, {1, 2, 4, 3}, {1, 2, 4, 2}},
       [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true); }, -2, 2},
      {"sdpa causal square, scale", {{2, 1, 5, 3}, {2, 1, 5, 3}, {2, 1, 5, 4}},
       [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true, 0.9); }, -2, 2},
      {"sdpa 3-D with float mask [L, S]", {{2, 3, 4}, {2, 5, 4}, {2, 5, 2}},
       [&](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2], float_mask); }, -2, 2},
      {"sdpa bool mask [B, 1, L, S]", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}},
       [&](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2], bool_mask); }, -2, 2},
      {"sdpa batch size 1, one query", {{1, 1, 1, 4}, {1, 1, 3, 4}, {1, 1, 3, 4}},
       [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, -2, 2},
      {"sdpa q only", {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}},
       [](const V& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, -2, 2, {true, false, false}},
      // Dropout: every call starts from one generator state, so every evaluation drops the
      // same weights and the finite differences see one function.
      {"sdpa dropout 0.4, causal", {{2, 2, 4, 3}, {2, 2, 5, 3}, {2, 2, 5, 2}},
       [](const V& x) {
         default_generator() = Generator{7, 100};
         return scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.4, true);
       }, -2, 2},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("attention: matches the explicit full matrix (f32 and f64, masks, causal)") {
  const int64_t B = 2, H = 3, L = 5, S = 70, E = 8, Ev = 6;  // S spans two key tiles
  const Tensor q = nd::testing::random_input({B, H, L, E}, 1, true, -2, 2);
  const Tensor k = nd::testing::random_input({B, H, S, E}, 2, false, -2, 2);
  const Tensor v = nd::testing::random_input({B, H, S, Ev}, 3, false, -2, 2);
  const auto qv = nd::testing::to_vector(q), kv = nd::testing::to_vector(k), vv = nd::testing::to_vector(v);
  const double scale = 1 / std::sqrt(8.0), inf = std::numeric_limits<double>::infinity();

  const auto plain = naive_attention(qv, kv, vv, B * H, L, S, E, Ev, scale, [](int64_t, int64_t, int64_t) { return 0.0; });
  nd::testing::check_close(scaled_dot_product_attention(q, k, v), plain, 1e-12, 1e-10, "f64");
  nd::testing::check_close(scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32)), plain,
                           1e-5, 1e-4, "f32");

  const auto causal = naive_attention(qv, kv, vv, B * H, L, S, E, Ev, scale,
                                      [&](int64_t, int64_t i, int64_t j) { return j > i ? -inf : 0.0; });
  nd::testing::check_close(scaled_dot_product_attention(q, k, v, {}, 0.0, true), causal, 1e-12, 1e-10, "causal");

  const Tensor mask = nd::testing::random_input({L, S}, 4, false, -3, 3);
  const auto mv = nd::testing::to_vector(mask);
  const auto masked = naive_attention(qv, kv, vv, B * H, L, S, E, Ev, scale,
                                      [&](int64_t, int64_t i, int64_t j) { return mv[i * S + j]; });
  nd::testing::check_close(scaled_dot_product_attention(q, k, v, mask), masked, 1e-12, 1e-10, "float mask");
}

TEST_CASE("attention: dropout drops the weights nd::dropout would drop from the materialised softmax") {
  const int64_t B = 2, H = 2, L = 5, S = 70, E = 8, Ev = 6;  // S spans two key tiles
  const double p = 0.3, scale = 1 / std::sqrt(8.0), inf = std::numeric_limits<double>::infinity();
  std::vector<double> causal_values(L * S);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < S; ++j) causal_values[i * S + j] = j > i ? -inf : 0.0;
  const Tensor causal = tensor(causal_values, kFloat64).reshape({L, S});
  const Tensor float_mask = nd::testing::random_input({B, 1, L, S}, 4, false, -3, 3);
  for (int variant = 0; variant < 3; ++variant) {  // no mask, causal, float mask
    CAPTURE(variant);
    const Tensor q = nd::testing::random_input({B, H, L, E}, 1, false, -2, 2).requires_grad_();
    const Tensor k = nd::testing::random_input({B, H, S, E}, 2, false, -2, 2).requires_grad_();
    const Tensor v = nd::testing::random_input({B, H, S, Ev}, 3, false, -2, 2).requires_grad_();
    const Tensor w = nd::testing::random_input({B, H, L, Ev}, 5, false, -1, 1);
    const Tensor additive = variant == 1 ? causal : variant == 2 ? float_mask : zeros({L, S}, kFloat64);
    manual_seed(42);
    const uint64_t offset = default_generator().offset;
    const Tensor out = scaled_dot_product_attention(q, k, v, variant == 2 ? float_mask : Tensor(), p, variant == 1);
    CHECK(default_generator().offset == offset + B * H * L * S);  // one draw per weight
    (out * w).sum().backward();
    const std::vector<Tensor> fused_grads = {q.grad().clone(), k.grad().clone(), v.grad().clone()};
    for (const Tensor& t : {q, k, v}) t.set_grad(Tensor());
    manual_seed(42);
    const Tensor weights = softmax(add(matmul(q, k.transpose(-2, -1)).mul(scale), additive), -1);
    const Tensor ref = matmul(dropout(weights, p, true), v);
    nd::testing::check_close(out, ref, 1e-12, 1e-10, "out");
    (ref * w).sum().backward();
    nd::testing::check_close(fused_grads[0], q.grad(), 1e-12, 1e-10, "dq");
    nd::testing::check_close(fused_grads[1], k.grad(), 1e-12, 1e-10, "dk");
    nd::testing::check_close(fused_grads[2], v.grad(), 1e-12, 1e-10, "dv");
    // About p of the weights were dropped: the output is not the undropped one.
    CHECK(nd::testing::to_vector(out) != nd::testing::to_vector(scaled_dot_product_attention(q, k, v)));
  }
  // The same seed gives the same output; the next call draws new weights; p = 1 drops all.
  const Tensor q = nd::testing::random_input({1, 2, 3, 4}, 6), kv = nd::testing::random_input({1, 2, 9, 4}, 7);
  manual_seed(3);
  const auto first = nd::testing::to_vector(scaled_dot_product_attention(q, kv, kv, {}, 0.5));
  const auto second = nd::testing::to_vector(scaled_dot_product_attention(q, kv, kv, {}, 0.5));
  manual_seed(3);
  CHECK(nd::testing::to_vector(scaled_dot_product_attention(q, kv, kv, {}, 0.5)) == first);
  CHECK(first != second);
  nd::testing::check_close(scaled_dot_product_attention(q, kv, kv, {}, 1.0), std::vector<double>(24, 0.0), 0, 0,
                           "p = 1");
}

TEST_CASE("attention: known values") {
  // Equal scores for both keys average the values; causal query 0 sees only key 0.
  Tensor q = tensor({1, 0}, kFloat64).reshape({1, 1, 1, 2});
  Tensor k = tensor({2, 5, 2, -3}, kFloat64).reshape({1, 1, 2, 2});
  Tensor v = tensor({1, 10, 3, 20}, kFloat64).reshape({1, 1, 2, 2});
  nd::testing::check_close(scaled_dot_product_attention(q, k, v), {2, 15}, 1e-12, 0, "average");
  nd::testing::check_close(scaled_dot_product_attention(q, k, v, {}, 0.0, true), {1, 10}, 1e-12, 0, "causal");
  // A bool mask hiding key 0 selects key 1.
  Tensor keep = tensor({0, 1}).gt(0.5);
  nd::testing::check_close(scaled_dot_product_attention(q, k, v, keep), {3, 20}, 1e-12, 0, "bool mask");
}

TEST_CASE("attention: argument errors") {
  using nd::testing::error_message;
  const Tensor q = ones({1, 2, 3, 4}), k = ones({1, 2, 5, 4}), v = ones({1, 2, 5, 3});
  CHECK(error_message([&] { scaled_dot_product_attention(q, k, v, {}, 1.5); })
            .find("expected dropout_p between 0 and 1, found 1.5") != std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(q, ones({1, 2, 5, 3}), v); })
            .find("expected key's last dim to equal query's (4), found key [cpu f32 [1, 2, 5, 3]]") !=
        std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(q, k, ones({1, 2, 4, 3})); })
            .find("expected value with as many rows as key (5)") != std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(ones({2, 3, 4}), k, v); })
            .find("expected query, key and value with the same number of dims") != std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(q, ones({2, 2, 5, 4}), ones({2, 2, 5, 3})); })
            .find("same batch and head dims") != std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(q, k, v, ones({3, 5}), 0.0, true); })
            .find("expected either attn_mask or is_causal, found both") != std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(q, k, v, ones({3, 4})); })
            .find("cannot be broadcast") != std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(q, k, v, ones({3, 5}).requires_grad_()); })
            .find("gradients for attn_mask are not supported") != std::string::npos);
  CHECK(error_message([&] { scaled_dot_product_attention(q, k, v, ones({3, 5}, kFloat64)); })
            .find("expected a bool attn_mask or one of the query's dtype (f32)") != std::string::npos);
}

TEST_CASE("attention: MultiheadAttention's heads-inner views run in place and match dense copies exactly") {
  // q, k, v as the module makes them: [B, S, H * E] split into heads, [B, H, S, E] views.
  const int64_t B = 2, H = 3, L = 5, S = 7, E = 4;
  for (const ScalarType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    const Tensor xq = nd::testing::random_input({B, L, H * E}, 1).to(dtype).requires_grad_();
    const Tensor xk = nd::testing::random_input({B, S, H * E}, 2).to(dtype).requires_grad_();
    const Tensor xv = nd::testing::random_input({B, S, H * E}, 3).to(dtype).requires_grad_();
    const Tensor w = nd::testing::random_input({B, L, H * E}, 4).to(dtype);
    auto heads = [&](const Tensor& x) { return x.reshape({B, x.size(1), H, E}).transpose(1, 2); };
    auto merge = [&](const Tensor& o) { return o.transpose(1, 2).reshape({B, L, H * E}); };

    const Tensor out = scaled_dot_product_attention(heads(xq), heads(xk), heads(xv));
    CHECK(out.transpose(1, 2).is_contiguous());  // merging the heads is a view
    merge(out).mul(w).sum().backward();
    // The same through dense copies (the kernel's other layout).
    const Tensor yq = xq.detach().requires_grad_(), yk = xk.detach().requires_grad_(), yv = xv.detach().requires_grad_();
    const Tensor dense = scaled_dot_product_attention(heads(yq).contiguous(), heads(yk).contiguous(), heads(yv).contiguous());
    CHECK(dense.is_contiguous());
    merge(dense).mul(w).sum().backward();

    CHECK(nd::testing::to_vector(out) == nd::testing::to_vector(dense));
    CHECK(nd::testing::to_vector(xq.grad()) == nd::testing::to_vector(yq.grad()));
    CHECK(nd::testing::to_vector(xk.grad()) == nd::testing::to_vector(yk.grad()));
    CHECK(nd::testing::to_vector(xv.grad()) == nd::testing::to_vector(yv.grad()));
    // And both equal the explicit full matrix.
    const auto plain = naive_attention(nd::testing::to_vector(heads(xq)), nd::testing::to_vector(heads(xk)),
                                       nd::testing::to_vector(heads(xv)), B * H, L, S, E, E, 1 / std::sqrt(4.0),
                                       [](int64_t, int64_t, int64_t) { return 0.0; });
    nd::testing::check_close(out, plain, 1e-5, 1e-4, "heads-inner");
  }
}
