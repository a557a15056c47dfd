// DCGAN: shapes, PyTorch's state_dict names and parameter counts, init statistics,
// forward/backward through G and D, input checks.
#include <algorithm>
#include <cmath>

#include "collectives/sync_batch_norm.h"
#include "harness.h"

using namespace nd;

namespace {

std::vector<std::string> keys(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m.state_dict()) out.push_back(k);
  return out;
}

// state_dict() is ordered by name; PyTorch's lists are in registration order.
std::vector<std::string> sorted(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  return names;
}

int64_t num_parameters(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

// Mean and standard deviation of every value in the tensors.
std::pair<double, double> moments(const std::vector<Tensor>& tensors) {
  double s = 0, ss = 0, n = 0;
  for (const Tensor& t : tensors)
    for (double v : nd::testing::to_vector(t)) s += v, ss += v * v, n += 1;
  const double mean = s / n;
  return {mean, std::sqrt(ss / n - mean * mean)};
}

}  // namespace

TEST_CASE("DCGAN: state_dict names and parameter counts are PyTorch's") {
  models::DCGANGenerator G;  // nz 100, ngf 64
  models::DCGANDiscriminator D;
  // From PyTorch: list(G.state_dict().keys()) for the tree of tests/golden/make_models_golden.py.
  CHECK(keys(*G) == sorted({"main.0.weight", "main.1.weight", "main.1.bias", "main.1.running_mean",
                            "main.1.running_var", "main.1.num_batches_tracked", "main.3.weight", "main.4.weight",
                            "main.4.bias", "main.4.running_mean", "main.4.running_var", "main.4.num_batches_tracked",
                            "main.6.weight"}));
  CHECK(keys(*D) == sorted({"main.0.weight", "main.2.weight", "main.3.weight", "main.3.bias", "main.3.running_mean",
                            "main.3.running_var", "main.3.num_batches_tracked", "main.5.weight"}));
  CHECK(num_parameters(*G) == 759680);
  CHECK(num_parameters(*D) == 138624);
  CHECK(G->main[0]->named_parameters()[0].second.sizes() == Shape{100, 128, 7, 7});
  CHECK(D->main[5]->named_parameters()[0].second.sizes() == Shape{1, 128, 7, 7});
}

TEST_CASE("DCGAN: shapes, range, and gradients reach every parameter") {
  manual_seed(1);
  models::DCGANGenerator G(16, 8);
  models::DCGANDiscriminator D(8);
  models::dcgan_init(*G);
  models::dcgan_init(*D);
  Tensor z = randn({5, 16});
  Tensor fake = G(z);
  CHECK(fake.sizes() == Shape{5, 1, 28, 28});
  CHECK(fake.abs().max().item() < 1.0);
  CHECK(G(z.reshape({5, 16, 1, 1})).sizes() == Shape{5, 1, 28, 28});
  Tensor logits = D(fake);
  CHECK(logits.sizes() == Shape{5});
  binary_cross_entropy_with_logits(logits, ones({5})).backward();
  for (const auto& [name, p] : G->named_parameters()) {
    CAPTURE(name);
    CHECK(p.grad().abs().sum().item() > 0);
  }
  for (const auto& [name, p] : D->named_parameters()) {
    CAPTURE(name);
    CHECK(p.grad().abs().sum().item() > 0);
  }
}

TEST_CASE("DCGAN: dcgan_init draws conv weights N(0, 0.02) and BatchNorm N(1, 0.02), bias 0") {
  manual_seed(7);
  models::DCGANGenerator G(100, 32);
  models::dcgan_init(*G);
  std::vector<Tensor> conv, bn_weight;
  for (const auto& [name, p] : G->named_parameters()) {
    if (name == "main.1.weight" || name == "main.4.weight") bn_weight.push_back(p);
    else if (name.ends_with(".bias")) CHECK(p.abs().max().item() == 0);
    else conv.push_back(p);
  }
  const auto [conv_mean, conv_std] = moments(conv);
  CHECK(std::abs(conv_mean) < 1e-3);
  CHECK(conv_std == doctest::Approx(0.02).epsilon(0.02));
  const auto [bn_mean, bn_std] = moments(bn_weight);
  CHECK(bn_mean == doctest::Approx(1.0).epsilon(0.01));
  CHECK(bn_std == doctest::Approx(0.02).epsilon(0.3));
}

TEST_CASE("DCGAN: dcgan_init also reaches BatchNorm layers already converted to SyncBatchNorm") {
  manual_seed(8);
  models::DCGANDiscriminator D(8);
  nn::convert_sync_batchnorm(D.ptr());
  models::dcgan_init(*D);
  Tensor w;  // the BatchNorm's weight
  for (const auto& [name, p] : D->named_parameters())
    if (name == "main.3.weight") w = p;
  REQUIRE(w.defined());
  CHECK(w.sub(1.0).abs().max().item() > 0);   // drawn, not the default ones
  CHECK(w.sub(1.0).abs().max().item() < 0.2);  // around 1 with spread 0.02
}

TEST_CASE("DCGAN: wrong input shapes are clear errors") {
  models::DCGANGenerator G(8, 4);
  models::DCGANDiscriminator D(4);
  CHECK(nd::testing::error_message([&] { G(zeros({2, 7})); }).find("expected z of shape [N, 8]") != std::string::npos);
  CHECK(nd::testing::error_message([&] { D(zeros({2, 1, 32, 32})); }).find("[N, 1, 28, 28]") != std::string::npos);
}
