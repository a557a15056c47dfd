// docs/traps.md's trap 9 in miniature: a generator, a discriminator and an MAE-like
// model, each with its own optimizer (Adam, Adam, AdamW + cosine), trained in one
// loop. Every parameter of every model must change and every model must learn.
#include "harness.h"

using namespace nd;

namespace {

Tensor real_batch(int64_t n, Generator& g) {
  // Data: N([1, -1, 0.5, 2], 0.1^2) per coordinate.
  return randn({n, 4}, kFloat32, &g) * 0.1 + tensor({1, -1, 0.5, 2});
}

std::vector<Tensor> snapshot(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("multi-model: G, D and an MAE with three optimizers all train") {
  manual_seed(3);
  nn::Sequential G(nn::Linear(nn::LinearOptions(8, 32)), nn::ReLU(), nn::Linear(nn::LinearOptions(32, 4)));
  nn::Sequential D(nn::Linear(nn::LinearOptions(4, 32)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                   nn::Linear(nn::LinearOptions(32, 1)));
  nn::Sequential mae(nn::Linear(nn::LinearOptions(4, 16)), nn::GELU(), nn::Linear(nn::LinearOptions(16, 4)));
  G->name_tensors("G");
  D->name_tensors("D");
  mae->name_tensors("MAE");
  optim::Adam opt_g(G->parameters(), optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  optim::Adam opt_d(D->parameters(), optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  optim::AdamW opt_mae(mae->parameters(), optim::AdamWOptions(1e-2));
  optim::CosineAnnealingLR sched(opt_mae, 300);
  const auto g0 = snapshot(*G), d0 = snapshot(*D), m0 = snapshot(*mae);

  Generator data{11, 0};
  auto mean_gap = [&](Generator& g) {  // |E[G(z)] - E[x]|, averaged over coordinates
    NoGradGuard no_grad;
    Tensor fake = G(randn({512, 8}, kFloat32, &g));
    return (fake.mean({0}) - tensor({1, -1, 0.5, 2})).abs().mean().item();
  };
  Generator probe{99, 0};
  const double gap0 = mean_gap(probe);
  double mae_first = 0, mae_last = 0;
  for (int step = 0; step < 300; ++step) {
    Tensor real = real_batch(64, data);
    Tensor z = randn({64, 8}, kFloat32, &data);
    Tensor fake = G(z);
    // D: real -> 1, fake -> 0 (fake detached: D's step must not touch G's graph).
    Tensor d_loss = binary_cross_entropy_with_logits(D(real), ones({64, 1})) +
                    binary_cross_entropy_with_logits(D(fake.detach()), zeros({64, 1}));
    opt_d.zero_grad();
    d_loss.backward();
    opt_d.step();
    // G: through the updated D, recomputed after D's step (story 2's fix).
    Tensor g_loss = binary_cross_entropy_with_logits(D(fake), ones({64, 1}));
    opt_g.zero_grad();
    g_loss.backward();
    opt_g.step();
    // MAE: reconstruct real samples from half-masked ones.
    Tensor mask = rand({64, 4}, kFloat32, &data).gt(0.5).to(kFloat32);
    Tensor mae_loss = mse_loss(mae(real * mask), real);
    opt_mae.zero_grad();
    mae_loss.backward();
    opt_mae.step();
    sched.step();
    if (step == 0) mae_first = mae_loss.item();
    mae_last = mae_loss.item();
  }
  Generator probe2{99, 0};
  const double gap = mean_gap(probe2);
  MESSAGE("G mean gap ", gap0, " -> ", gap, "; MAE loss ", mae_first, " -> ", mae_last);
  CHECK(gap < 0.5 * gap0);
  CHECK(mae_last < 0.2 * mae_first);
  auto check_all_changed = [](const nn::Module& m, const std::vector<Tensor>& before) {
    auto params = m.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      CAPTURE(params[i].name());
      CHECK(nd::testing::to_vector(params[i]) != nd::testing::to_vector(before[i]));
    }
  };
  check_all_changed(*G, g0);
  check_all_changed(*D, d0);
  check_all_changed(*mae, m0);
  CHECK(opt_mae.param_groups()[0].options().get_lr() < 1e-4);  // the cosine schedule ran to its end
}
