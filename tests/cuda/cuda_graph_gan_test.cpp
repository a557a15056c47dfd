// A DCGAN training iteration captured as a CUDA graph (kernels/cuda/graph.h): apps/train_gan's
// step (G's forward, D's step on real and fake, G's step through D, BatchNorm in both, two
// Adams, f16 autocast, one GradScaler deciding on the device) at a small size, captured after
// two eager warm-up iterations and replayed 5 times on static tensors, equals the eager
// iterations bit for bit: the losses, the scale, whether the steps were skipped (one iteration's
// losses are multiplied by inf: both steps skipped, the scale halved, as eagerly), every
// parameter and BatchNorm buffer of G and D, and both Adams' state. About 20-30 CPU-seconds on
// the emulator (every CUDA thread an OS thread): labelled slow there. Without a GPU it reports
// "SKIPPED:".
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/cuda_compare.h"
#include "cuda/graph_iteration.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing::cuda_compare;
using nd::testing::check_same_iteration;
using nd::testing::iteration_of;
using nd::testing::kNonFiniteIteration;
using nd::testing::ScaledIteration;

namespace {

// train_gan's iteration on DCGAN's models at a small size (nz 8, 4 feature maps, batch 2):
// D's step on real and fake, then G's, both Adam under f16 autocast with one GradScaler. The
// losses are multiplied by `weight` (1, or inf to make every gradient non-finite while the
// forward, BatchNorm's running statistics included, stays finite).
struct Gan {
  models::DCGANGenerator G{8, 4};
  models::DCGANDiscriminator D{4};
  optim::Adam opt_g{G->parameters(), optim::AdamOptions(2e-4).betas({0.5, 0.999})};
  optim::Adam opt_d{D->parameters(), optim::AdamOptions(2e-4).betas({0.5, 0.999})};
  optim::GradScaler scaler{optim::GradScalerOptions().init_scale(256.0).growth_interval(2)};
  Gan() {
    G->to(kGpu);
    D->to(kGpu);
  }
  static Tensor bce(const Tensor& logits, bool real) {
    return binary_cross_entropy_with_logits(logits, real ? ones_like(logits) : zeros_like(logits));
  }
  // The two losses (unscaled), stacked.
  Tensor step(const Tensor& real, const Tensor& z, const Tensor& weight) {
    AutocastGuard autocast(kCUDA, true, kFloat16);
    const Tensor fake = G(z);
    opt_d.zero_grad();
    const Tensor loss_d = (bce(D(real), true) + bce(D(fake.detach()), false)) * weight;
    scaler.scale(loss_d).backward();
    scaler.step(opt_d);
    opt_g.zero_grad();
    const Tensor loss_g = bce(D(fake), true) * weight;
    scaler.scale(loss_g).backward();
    scaler.step(opt_g);
    scaler.update();
    return stack({loss_d, loss_g});
  }
  std::vector<std::pair<std::string, Tensor>> state() const {
    auto out = G->named_parameters();
    for (const auto& [name, t] : G->named_buffers()) out.emplace_back("G." + name, t);
    for (const auto& [name, t] : D->named_parameters()) out.emplace_back("D." + name, t);
    for (const auto& [name, t] : D->named_buffers()) out.emplace_back("D." + name, t);
    return out;
  }
};

Tensor gan_real(int i) {
  Generator g{uint64_t(500 + i), 0};
  return rand({2, 1, 28, 28}, kFloat32, &g) * 2.0 - 1.0;
}

Tensor gan_z(int i) {
  Generator g{uint64_t(600 + i), 0};
  return randn({2, 8}, kFloat32, &g);
}

Tensor gan_weight(int i) { return full({}, i == kNonFiniteIteration ? std::numeric_limits<double>::infinity() : 1.0); }

}  // namespace

TEST_CASE("cuda graphs: a DCGAN step (G and D, two Adams, f16 autocast, one GradScaler) replayed 5 times equals eager bit for bit, a skipped step included") {
  if (skip_without_gpu()) return;
  constexpr int kSteps = 7, kWarmup = 2;
  manual_seed(5);
  Gan eager;
  manual_seed(5);
  Gan graphed;
  std::vector<ScaledIteration> eager_after;
  for (int i = 0; i < kSteps; ++i)
    eager_after.push_back(
        iteration_of(eager.step(gan_real(i).to(kGpu), gan_z(i).to(kGpu), gan_weight(i).to(kGpu)), eager.scaler));
  CHECK(eager_after[kNonFiniteIteration].skipped);  // the case is what it claims
  CHECK_FALSE(eager_after[kNonFiniteIteration - 1].skipped);

  Tensor real = empty({2, 1, 28, 28}, TensorOptions().device(kGpu)), z = empty({2, 8}, TensorOptions().device(kGpu));
  Tensor weight = empty({}, TensorOptions().device(kGpu));
  auto fill = [&](int i) {
    real.copy_(gan_real(i));
    z.copy_(gan_z(i));
    weight.copy_(gan_weight(i));
  };
  for (int i = 0; i < kWarmup; ++i) {
    fill(i);
    check_same_iteration(iteration_of(graphed.step(real, z, weight), graphed.scaler), eager_after[i]);
  }
  cuda::Graph graph(0);
  graph.capture_begin();
  const Tensor losses = graphed.step(real, z, weight);
  graph.capture_end();
  for (int i = kWarmup; i < kSteps; ++i) {
    CAPTURE(i);
    fill(i);
    graph.replay();
    check_same_iteration(iteration_of(losses, graphed.scaler), eager_after[i]);
  }
  const auto se = eager.state(), sg = graphed.state();
  REQUIRE(se.size() == sg.size());
  for (size_t i = 0; i < se.size(); ++i) {
    CAPTURE(se[i].first);
    CHECK(testing::bitwise_equal(sg[i].second.cpu(), se[i].second.cpu()));
  }
  for (const auto& [name, opt_e, opt_g] : {std::tuple{"G", &eager.opt_g, &graphed.opt_g},
                                           std::tuple{"D", &eager.opt_d, &graphed.opt_d}}) {
    CAPTURE(name);
    const TensorDict de = opt_e->state_dict(), dg = opt_g->state_dict();
    for (const auto& [key, value] : de) {
      CAPTURE(key);
      CHECK(testing::bitwise_equal(dg.at(key).cpu(), value.cpu()));
    }
  }
}
