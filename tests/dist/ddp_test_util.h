#pragma once
// What the DDP tests share (tests/dist/ddp_test.cpp, ddp_options_test.cpp,
// ddp_divergence_test.cpp, ddp_comm_hooks_test.cpp, ddp_powersgd_test.cpp, zero_test.cpp):
// this rank and the world size, the small MLP most cases train, this rank's rows of a
// global batch, parameter equality, a GAN step, bucket layouts, a cross-rank equality check, every
// rank's copy of a tensor and their exact average, and the skip for cases that need
// several ranks.
#include <algorithm>
#include <string>
#include <vector>

#include "harness.h"

namespace nd::testing::ddp {

inline int rank() { return dist::world()->rank(); }
inline int world_size() { return dist::world()->size(); }

inline nn::Sequential make_mlp() {
  return nn::Sequential(nn::Linear(nn::LinearOptions(6, 16)), nn::Tanh(), nn::Linear(nn::LinearOptions(16, 3)));
}

// A trunk and two heads; head b takes part only when forward is told to use it.
struct Branchy : nn::Module {
  nn::Linear trunk{nn::LinearOptions(4, 8)}, a{nn::LinearOptions(8, 2)}, b{nn::LinearOptions(8, 2)};
  Branchy() : nn::Module("Branchy") {
    register_module("trunk", trunk);
    register_module("a", a);
    register_module("b", b);
  }
  Tensor forward(const Tensor& x, bool use_b) {
    Tensor h = tanh(trunk(x));
    return use_b ? a(h) + b(h) : a(h);
  }
};

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Bucket layout as parameter indices (registration order), bucket after bucket, -1 between.
inline std::vector<int64_t> layout_indices(const nn::Module& m, const std::vector<std::vector<std::string>>& buckets) {
  auto named = m.named_parameters();
  std::vector<int64_t> out;
  for (const auto& bucket : buckets) {
    for (const std::string& name : bucket)
      for (size_t i = 0; i < named.size(); ++i)
        if (named[i].first == name) out.push_back(static_cast<int64_t>(i));
    out.push_back(-1);
  }
  return out;
}

// Rows [rank * n / W, (rank + 1) * n / W) of a global batch.
inline Tensor shard(const Tensor& global) {
  const int64_t n = global.size(0), W = world_size();
  return global.narrow(0, rank() * n / W, n / W);
}

inline void check_same_params(const nn::Module& a, const nn::Module& b, double tol) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].first);
    nd::testing::check_close(pa[i].second, pb[i].second, tol, tol, pa[i].first);
  }
}

// One GAN step as train_gan takes it: D on real vs detached fake (BCE with logits), then G
// through D.
template <class GF, class DF>
void gan_step(GF& Gf, DF& Df, optim::Optimizer& og, optim::Optimizer& od, const Tensor& z, const Tensor& real) {
  Tensor fake = Gf(z);
  od.zero_grad();
  Tensor on_real = Df(real), on_fake = Df(fake.detach());
  (binary_cross_entropy_with_logits(on_real, ones_like(on_real)) +
   binary_cross_entropy_with_logits(on_fake, zeros_like(on_fake)))
      .backward();
  od.step();
  og.zero_grad();
  Tensor judged = Df(fake);
  binary_cross_entropy_with_logits(judged, ones_like(judged)).backward();
  og.step();
}

// True when every rank passes the same values (one all-gather over the world).
inline bool same_on_every_rank(const std::vector<int64_t>& mine) {
  auto w = dist::world();
  std::vector<double> v(mine.begin(), mine.end());
  std::vector<Tensor> all;
  for (int r = 0; r < w->size(); ++r) all.push_back(empty({static_cast<int64_t>(v.size())}, kInt64));
  w->allgather(all, tensor(v, kInt64))->wait();
  for (int r = 0; r < w->size(); ++r)
    if (!nd::testing::bitwise_equal(all[r], all[0])) return false;
  return true;
}

// Every rank's `t` (contiguous), by rank: one all-gather over the world.
inline std::vector<Tensor> gather_from_ranks(const Tensor& t) {
  auto w = dist::world();
  std::vector<Tensor> all;
  for (int r = 0; r < w->size(); ++r) all.push_back(empty(t.sizes(), t.options()));
  w->allgather(all, t.contiguous())->wait();
  return all;
}

// The exact average over the ranks of `t` (f64, summed in rank order on every rank).
inline Tensor mean_over_ranks(const Tensor& t) {
  Tensor sum = zeros(t.sizes(), kFloat64);
  for (const Tensor& x : gather_from_ranks(t.to(kFloat64))) sum = sum + x;
  return sum / static_cast<double>(world_size());
}

// make_mlp() in f64, its weights drawn from `seed`.
inline nn::Sequential make_mlp64(uint64_t seed) {
  manual_seed(seed);
  nn::Sequential m = make_mlp();
  m->to(kFloat64);
  return m;
}

// One step on this rank's own batch of 8 (so that the first layer's gradient has full
// rank 6): the replica's gradients without DDP (`local`), then the DDP model's (`reduced`).
struct HookStep {
  std::vector<std::string> names;
  std::vector<Tensor> local, reduced;
};
template <class Ddp>
HookStep step_on_own_batch(Ddp& ddp, nn::Sequential& replica, Generator& data) {
  const Tensor x = randn({8, 6}, kFloat64, &data), y = randn({8, 3}, kFloat64, &data);
  HookStep step;
  replica->zero_grad();
  mse_loss(replica(x), y).backward();
  for (const Tensor& p : replica->parameters()) step.local.push_back(p.grad().clone());
  ddp.module()->zero_grad();
  mse_loss(ddp(x), y).backward();
  for (const auto& [name, p] : ddp.module()->named_parameters()) {
    step.names.push_back(name);
    step.reduced.push_back(p.grad().clone());
  }
  return step;
}

// Checks every reduced gradient against the exact average of the ranks' local ones:
// |reduced - exact| <= bound(exact, sum_r |local_r| / W) elementwise. Returns the largest
// |reduced - exact|.
template <class Bound>
double check_against_exact(const HookStep& step, Bound bound) {
  double worst = 0;
  for (size_t k = 0; k < step.local.size(); ++k) {
    const Tensor exact = mean_over_ranks(step.local[k]);
    const Tensor error = (step.reduced[k] - exact).abs();
    CAPTURE(step.names[k]);
    CHECK((error - bound(exact, mean_over_ranks(step.local[k].abs()))).max().item() <= 0);
    worst = std::max(worst, error.max().item());
  }
  return worst;
}

// A bound for results that only rounding separates from the exact average.
inline Tensor rounding_only(const Tensor& exact, const Tensor& abs_mean) { return (exact.abs() + abs_mean) * 1e-12 + 1e-15; }

// True (after printing SKIPPED) when this process is the only rank.
inline bool skip_at_one_rank() {
  if (world_size() > 1) return false;
  MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
  return true;
}

}  // namespace nd::testing::ddp
