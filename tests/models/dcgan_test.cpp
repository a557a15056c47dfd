// DCGAN: the configs by name, shapes, PyTorch's state_dict names and parameter counts
// (examples/dcgan's at dcgan64), init statistics, forward/backward through G and D,
// input and config checks, and the training step with each BatchNorm2d + activation as one
// op bit for bit that of the modules one by one (SyncBatchNorm keeping the pair apart).
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

TEST_CASE("DCGAN: state_dict names and parameter counts are PyTorch's (28x28)") {
  models::DCGANGenerator G(/*nz=*/100, /*ngf=*/64);
  models::DCGANDiscriminator D(/*ndf=*/64);
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

TEST_CASE("DCGAN: dcgan64 is examples/dcgan's tree: keys, parameter counts, shapes") {
  models::DCGANGenerator G(models::DCGANConfig::by_name("dcgan64"));
  models::DCGANDiscriminator D(models::DCGANConfig::by_name("dcgan64"));
  // From PyTorch: list(netG.state_dict().keys()) of examples/dcgan/main.py (its
  // Sigmoid, D's main.12, has no state).
  std::vector<std::string> g_keys, d_keys;
  auto add_bn = [](std::vector<std::string>& out, int i) {
    for (const char* k : {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})
      out.push_back("main." + std::to_string(i) + "." + k);
  };
  for (int i : {0, 3, 6, 9, 12}) g_keys.push_back("main." + std::to_string(i) + ".weight");
  for (int i : {1, 4, 7, 10}) add_bn(g_keys, i);
  for (int i : {0, 2, 5, 8, 11}) d_keys.push_back("main." + std::to_string(i) + ".weight");
  for (int i : {3, 6, 9}) add_bn(d_keys, i);
  CHECK(keys(*G) == sorted(g_keys));
  CHECK(keys(*D) == sorted(d_keys));
  CHECK(num_parameters(*G) == 3576704);  // PyTorch's count for netG (and netD below)
  CHECK(num_parameters(*D) == 2765568);
  const TensorDict g = G->state_dict(), d = D->state_dict();
  CHECK(g.at("main.0.weight").sizes() == Shape{100, 512, 4, 4});
  CHECK(g.at("main.12.weight").sizes() == Shape{64, 3, 4, 4});
  CHECK(d.at("main.0.weight").sizes() == Shape{64, 3, 4, 4});
  CHECK(d.at("main.11.weight").sizes() == Shape{1, 512, 4, 4});
  manual_seed(3);
  models::dcgan_init(*G);
  models::dcgan_init(*D);
  const Tensor fake = G(randn({2, 100}));
  CHECK(fake.sizes() == Shape{2, 3, 64, 64});
  CHECK(D(fake).sizes() == Shape{2});
}

TEST_CASE("DCGAN: the configs by name, dcgan32's shapes and counts, bad names and sizes") {
  using models::DCGANConfig;
  const DCGANConfig c28 = DCGANConfig::by_name("dcgan28"), c32 = DCGANConfig::by_name("dcgan32");
  CHECK((c28.image_size == 28 && c28.nc == 1 && c28.nz == 64 && c28.ngf == 32 && c28.ndf == 32));
  CHECK((c28.base() == 7 && c28.upsamplings() == 2));
  CHECK((c32.image_size == 32 && c32.nc == 3 && c32.nz == 100 && c32.ngf == 64 && c32.ndf == 64));
  CHECK((c32.base() == 4 && c32.upsamplings() == 3));
  CHECK(DCGANConfig::by_name("dcgan64").upsamplings() == 4);
  // dcgan28 is what the apps build by default: DCGANGenerator(64, 32), DCGANDiscriminator(32).
  CHECK(keys(*models::DCGANGenerator(c28)) == keys(*models::DCGANGenerator(64, 32)));
  CHECK(num_parameters(*models::DCGANGenerator(c28)) == 234176);  // PyTorch's, as all counts here
  CHECK(num_parameters(*models::DCGANDiscriminator(c28)) == 36544);
  models::DCGANGenerator G(c32);
  models::DCGANDiscriminator D(c32);
  CHECK(num_parameters(*G) == 1068928);
  CHECK(num_parameters(*D) == 663296);
  CHECK(G->state_dict().at("main.9.weight").sizes() == Shape{64, 3, 4, 4});
  CHECK(D->state_dict().at("main.8.weight").sizes() == Shape{1, 256, 4, 4});
  const Tensor fake = G(randn({2, 100}));
  CHECK(fake.sizes() == Shape{2, 3, 32, 32});
  CHECK(D(fake).sizes() == Shape{2});
  CHECK(nd::testing::error_message([] { DCGANConfig::by_name("dcgan128"); }) ==
        "DCGANConfig: unknown configuration 'dcgan128' (expected dcgan28, dcgan32 or dcgan64)");
  DCGANConfig odd = c32;
  odd.image_size = 48;
  CHECK(nd::testing::error_message([&] { (void)models::DCGANGenerator(odd); }) ==
        "DCGANConfig: image_size must be 4 * 2^k or 7 * 2^k with k >= 1 (28, 32, 64, ...), got 48");
  odd.image_size = 4;
  CHECK(nd::testing::error_message([&] { (void)models::DCGANDiscriminator(odd); }).find("got 4") != std::string::npos);
  CHECK(DCGANConfig{28, 1, 8, 4, 4}.base() == 7);
  odd = c32;
  odd.nc = 0;
  CHECK(nd::testing::error_message([&] { (void)models::DCGANDiscriminator(odd); }) ==
        "DCGANDiscriminator: nz, ngf, ndf and nc must be positive, got nz=100, ngf=64, ndf=64, nc=0");
  CHECK(nd::testing::error_message([&] { D(zeros({2, 1, 32, 32})); }) ==
        "DCGANDiscriminator: expected images of shape [N, 3, 32, 32], found [cpu f32 [2, 1, 32, 32]]");
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

// apps/train_gan's step (D on real and fake, then G through D, Adam on both) three times on
// the same seeds: once through the models' Sequentials (each BatchNorm2d + ReLU /
// LeakyReLU one op), once with every module called one by one. The losses, every
// parameter, gradient and buffer equal bit for bit. Converted to SyncBatchNorm, the
// pair stays two ops (its output is the activation's).
TEST_CASE("DCGAN: a training step with BatchNorm + activation as one op is the modules' step, bit for bit") {
  auto chain = [](const nn::Sequential& seq, Tensor x, bool fused) {
    if (fused) return seq->forward(x);
    for (const auto& m : *seq) x = m->forward(x);
    return x;
  };
  auto train = [&](bool fused) {
    manual_seed(11);
    models::DCGANGenerator G(8, 4);
    models::DCGANDiscriminator D(4);
    models::dcgan_init(*G);
    models::dcgan_init(*D);
    optim::Adam opt_g(G->parameters(), optim::AdamOptions(2e-4)), opt_d(D->parameters(), optim::AdamOptions(2e-4));
    auto d = [&](const Tensor& images) { return chain(D->main, images, fused).reshape({images.size(0)}); };
    std::vector<Tensor> out;
    for (int step = 0; step < 3; ++step) {
      const Tensor real = rand({4, 1, 28, 28}) * 2.0 - 1.0;
      const Tensor fake = chain(G->main, randn({4, 8, 1, 1}), fused);
      opt_d.zero_grad();
      const Tensor loss_d = binary_cross_entropy_with_logits(d(real), ones({4})) +
                            binary_cross_entropy_with_logits(d(fake.detach()), zeros({4}));
      loss_d.backward();
      opt_d.step();
      opt_g.zero_grad();
      const Tensor loss_g = binary_cross_entropy_with_logits(d(fake), ones({4}));
      loss_g.backward();
      opt_g.step();
      out.push_back(loss_d.detach());
      out.push_back(loss_g.detach());
    }
    for (const nn::Module* m : {static_cast<nn::Module*>(G.get()), static_cast<nn::Module*>(D.get())}) {
      for (const auto& [name, t] : m->state_dict()) out.push_back(t);
      for (const Tensor& p : m->parameters()) out.push_back(p.grad());
    }
    return out;
  };
  const std::vector<Tensor> fused = train(true), one_by_one = train(false);
  REQUIRE(fused.size() == one_by_one.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(i);
    CHECK(nd::testing::bitwise_equal(fused[i], one_by_one[i]));
  }
  // The fused op is there: D's BatchNorm (main.3) and its LeakyReLU (main.4) as one node.
  models::DCGANDiscriminator D(4);
  const Tensor x = randn({2, 4, 14, 14});
  const nn::Sequential pair(D->main[2], D->main[3], D->main[4]);
  CHECK(pair->forward(x).grad_fn()->name() == "NativeBatchNormLeakyReluBackward");
  nn::convert_sync_batchnorm(D.ptr());
  const nn::Sequential converted(D->main[2], D->main[3], D->main[4]);
  CHECK(converted->forward(x).grad_fn()->name() == "LeakyReluBackward");
}

TEST_CASE("DCGAN: wrong input shapes are clear errors") {
  models::DCGANGenerator G(8, 4);
  models::DCGANDiscriminator D(4);
  CHECK(nd::testing::error_message([&] { G(zeros({2, 7})); }).find("expected z of shape [N, 8]") != std::string::npos);
  CHECK(nd::testing::error_message([&] { D(zeros({2, 1, 32, 32})); }).find("[N, 1, 28, 28]") != std::string::npos);
}

