// Every options type chains through its own setters: a chain of setters on T is a T&, so
// AdamW(params, AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.05)) compiles and keeps
// AdamW's options (before, AdamWOptions' setters returned AdamOptions&, which AdamW refused).
// The static_asserts are the compile test; the cases check the values arrive.
#include <type_traits>

#include "doctest/doctest.h"
#include "nanoddp.h"

namespace {

using namespace nd;

// The type a chain of two setters gives, for an options value made by make().
#define ND_CHAINS_TO_ITSELF(T, make, first, second) \
  static_assert(std::is_same_v<decltype(make.first.second), T&>, #T " does not chain through " #first)

ND_CHAINS_TO_ITSELF(optim::SGDOptions, optim::SGDOptions(0.1), momentum(0.9), nesterov(true));
ND_CHAINS_TO_ITSELF(optim::AdamOptions, optim::AdamOptions(1e-3), betas({0.5, 0.999}), weight_decay(0));
ND_CHAINS_TO_ITSELF(optim::AdamWOptions, optim::AdamWOptions(1e-3), betas({0.9, 0.95}), weight_decay(0.05));
ND_CHAINS_TO_ITSELF(optim::AdamWOptions, optim::AdamWOptions(1e-3), lr(1e-4), eps(1e-6));
ND_CHAINS_TO_ITSELF(optim::AdamWOptions, optim::AdamWOptions(1e-3), eps(1e-6), amsgrad(true));
ND_CHAINS_TO_ITSELF(optim::GradScalerOptions, optim::GradScalerOptions(), init_scale(1024), growth_interval(10));
ND_CHAINS_TO_ITSELF(nn::Conv2dOptions, nn::Conv2dOptions(1, 8, 4), stride(2), padding(1));
ND_CHAINS_TO_ITSELF(nn::ConvTranspose2dOptions, nn::ConvTranspose2dOptions(8, 1, 4), stride(2), bias(false));
ND_CHAINS_TO_ITSELF(nn::LinearOptions, nn::LinearOptions(4, 3), bias(false), in_features(5));
ND_CHAINS_TO_ITSELF(nn::BatchNormOptions, nn::BatchNormOptions(8), eps(1e-3), momentum(0.2));
ND_CHAINS_TO_ITSELF(nn::LayerNormOptions, nn::LayerNormOptions({8}), eps(1e-6), bias(false));
ND_CHAINS_TO_ITSELF(nn::MultiheadAttentionOptions, nn::MultiheadAttentionOptions(8, 2), dropout(0.1), batch_first(true));
ND_CHAINS_TO_ITSELF(nn::EmbeddingOptions, nn::EmbeddingOptions(10, 4), padding_idx(0), embedding_dim(5));
ND_CHAINS_TO_ITSELF(nn::DropoutOptions, nn::DropoutOptions(0.5), p(0.25), p(0.3));
ND_CHAINS_TO_ITSELF(nn::LeakyReLUOptions, nn::LeakyReLUOptions(), negative_slope(0.2), negative_slope(0.1));
ND_CHAINS_TO_ITSELF(nn::FlattenOptions, nn::FlattenOptions(), start_dim(0), end_dim(1));
ND_CHAINS_TO_ITSELF(nn::GELUOptions, nn::GELUOptions(), approximate("tanh"), approximate("none"));
ND_CHAINS_TO_ITSELF(nn::MSELossOptions, nn::MSELossOptions(), reduction(Reduction::Sum), reduction(Reduction::Mean));
ND_CHAINS_TO_ITSELF(nn::BCEWithLogitsLossOptions, nn::BCEWithLogitsLossOptions(), reduction(Reduction::Sum), pos_weight(Tensor()));
ND_CHAINS_TO_ITSELF(nn::CrossEntropyLossOptions, nn::CrossEntropyLossOptions(), ignore_index(0), label_smoothing(0.1));
ND_CHAINS_TO_ITSELF(dist::DistributedDataParallelOptions, dist::DistributedDataParallelOptions(), bucket_cap_mb(1), static_graph(true));
ND_CHAINS_TO_ITSELF(data::DataLoaderOptions, data::DataLoaderOptions(8), shuffle(true), drop_last(true));
#undef ND_CHAINS_TO_ITSELF

TEST_CASE("AdamWOptions chained through its setters keeps AdamW's options and builds an AdamW") {
  optim::AdamWOptions o = optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.05).eps(1e-6).amsgrad(true);
  CHECK(o.lr_ == 1e-3);
  CHECK(o.betas_ == std::pair<double, double>{0.9, 0.95});
  CHECK(o.weight_decay_ == 0.05);
  CHECK(o.eps_ == 1e-6);
  CHECK(o.amsgrad_);
  CHECK(optim::AdamWOptions(2e-4).lr(1e-4).weight_decay_ == 1e-2);  // AdamW's default survives a chain

  Tensor w = tensor({1.0, -2.0}, TensorOptions(kFloat64)).requires_grad_(true);
  optim::AdamW opt({w}, optim::AdamWOptions(0.1).betas({0.9, 0.95}).weight_decay(0.5));
  (w * w).sum().backward();
  opt.step();
  // Step 1 of AdamW: w <- w (1 - lr wd) - lr sign(g) (m_hat / sqrt(v_hat) = g / |g| up to eps).
  const double eps = 1e-8;
  CHECK(w.select(0, 0).item() == doctest::Approx(1.0 * (1 - 0.1 * 0.5) - 0.1 * 2.0 / (2.0 + eps)).epsilon(1e-12));
  CHECK(w.select(0, 1).item() == doctest::Approx(-2.0 * (1 - 0.1 * 0.5) + 0.1 * 4.0 / (4.0 + eps)).epsilon(1e-12));
}

}  // namespace
