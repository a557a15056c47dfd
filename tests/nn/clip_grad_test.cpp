// Gradient clipping (engine/nn/clip_grad.h) against torch.nn.utils.clip_grad_norm_ and
// clip_grad_value_ (tests/golden/make_clip_grad_golden.py): norm types 2 (clipping and not),
// 1, 3 and infinity, the returned total, a parameter without a gradient skipped; then f32,
// the GradScaler flow (unscale_, clip, step) and every error.
#include <cmath>
#include <limits>
#include <map>

#include "harness.h"

using namespace nd;
using nd::testing::error_message;

namespace {

std::map<std::string, std::vector<double>> load_golden() {
  return nd::testing::read_golden_table(std::string(NANODDP_SOURCE_DIR) + "/tests/golden/clip_grad_golden.txt");
}

// The script's parameters: three with gradients, one without.
std::vector<Tensor> params(ScalarType dtype = kFloat64) {
  std::vector<Tensor> ps = {zeros({2, 3}, dtype).requires_grad_(), zeros({2}, dtype).requires_grad_(),
                            zeros({1, 1}, dtype).requires_grad_(), ones({2}, dtype).requires_grad_()};
  ps[0].set_grad(tensor({0.5, -1.2, 0.3, 2.0, 0.1, -0.7}, dtype).reshape({2, 3}));
  ps[1].set_grad(tensor({0.9, -0.05}, dtype));
  ps[2].set_grad(tensor({-1.5}, dtype).reshape({1, 1}));
  return ps;
}

std::vector<double> grads(const std::vector<Tensor>& ps) {
  std::vector<double> out;
  for (size_t i = 0; i < 3; ++i)
    for (double v : nd::testing::to_vector(ps[i].grad())) out.push_back(v);
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("clip_grad_norm_ and clip_grad_value_ match torch.nn.utils") {
  const auto golden = load_golden();
  const double inf = std::numeric_limits<double>::infinity();
  const std::tuple<const char*, double, double> cases[] = {{"norm2_clipped", 1.0, 2.0}, {"norm2_unclipped", 100.0, 2.0},
                                                           {"norm1", 0.5, 1.0}, {"norm_inf", 0.3, inf},
                                                           {"norm3", 0.7, 3.0}};
  for (const auto& [name, max_norm, norm_type] : cases) {
    CAPTURE(name);
    REQUIRE(golden.count(name));
    const std::vector<double>& g = golden.at(name);
    const std::vector<Tensor> ps = params();
    const Tensor total = nn::utils::clip_grad_norm_(ps, max_norm, norm_type);
    CHECK(total.dim() == 0);
    CHECK(total.item() == doctest::Approx(g[0]).epsilon(1e-12));
    const std::vector<double> got = grads(ps), want(g.begin() + 1, g.end());
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
    CHECK_FALSE(ps[3].grad().defined());
  }
  const std::vector<Tensor> ps = params();
  nn::utils::clip_grad_value_(ps, 0.6);
  const std::vector<double>& g = golden.at("value_0.6");
  CHECK(grads(ps) == std::vector<double>(g.begin() + 1, g.end()));
}

TEST_CASE("clip_grad_norm_: f32 gradients, no gradients at all, and the GradScaler flow") {
  const std::vector<Tensor> ps = params(kFloat32);
  const Tensor total = nn::utils::clip_grad_norm_(ps, 1.0);
  CHECK(total.dtype() == kFloat32);
  CHECK(total.item() == doctest::Approx(3.056550343115585).epsilon(1e-6));
  double sq = 0;
  for (double v : grads(ps)) sq += v * v;
  CHECK(std::sqrt(sq) == doctest::Approx(1.0).epsilon(1e-5));  // clipped to max_norm
  CHECK(nn::utils::clip_grad_norm_({zeros({3}).requires_grad_()}, 1.0).item() == 0.0);

  // scale -> backward -> unscale_ -> clip -> step: the clip sees the true gradient.
  Tensor w = tensor({3.0, 4.0}).requires_grad_();
  optim::SGD opt(std::vector<Tensor>{w}, optim::SGDOptions(1.0));
  optim::GradScaler scaler(optim::GradScalerOptions().init_scale(1024.0));
  scaler.scale((w * tensor({3.0, 4.0})).sum()).backward();  // d/dw = [3, 4], norm 5
  scaler.unscale_(opt);
  CHECK(nn::utils::clip_grad_norm_({w}, 1.0).item() == doctest::Approx(5.0));
  CHECK(scaler.step(opt));
  scaler.update();
  const std::vector<double> after = nd::testing::to_vector(w);
  CHECK(after[0] == doctest::Approx(3.0 - 0.6).epsilon(1e-5));
  CHECK(after[1] == doctest::Approx(4.0 - 0.8).epsilon(1e-5));
}

TEST_CASE("clip_grad_norm_ and clip_grad_value_: bad input is an nd::Error naming it") {
  const std::vector<Tensor> ps = params();
  CHECK(contains(error_message([&] { nn::utils::clip_grad_norm_(ps, 1.0, 0.0); }), "expected norm_type > 0"));
  CHECK(contains(error_message([&] { nn::utils::clip_grad_value_(ps, -1.0); }), "expected clip_value >= 0"));
  ps[1].grad().fill_(std::nan(""));
  const std::string msg = error_message([&] { nn::utils::clip_grad_norm_(ps, 1.0, 2.0, true); });
  CHECK(contains(msg, "clip_grad_norm_: the total norm of order 2 of the gradients is nan"));
  CHECK(contains(msg, "error_if_nonfinite = false"));
  // Without the flag the NaN norm is applied, as in PyTorch.
  CHECK(std::isnan(nn::utils::clip_grad_norm_(ps, 1.0).item()));
}

TEST_CASE("clip_grad_norm_: gradients of several dtypes are clipped together") {
  std::vector<Tensor> mixed = params();
  mixed[1] = zeros({2}, kFloat32).requires_grad_();
  mixed[1].set_grad(tensor({0.9, -0.05}, kFloat32));
  const Tensor total = nn::utils::clip_grad_norm_(mixed, 1.0);
  CHECK(total.dtype() == kFloat64);
  CHECK(total.item() == doctest::Approx(3.056550343115585).epsilon(1e-7));
  CHECK(mixed[1].grad().dtype() == kFloat32);
  CHECK(nd::testing::to_vector(mixed[1].grad())[0] == doctest::Approx(0.2944494951891165).epsilon(1e-6));
}
