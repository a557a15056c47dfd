// GradScaler (engine/optim/grad_scaler.h): the scale's growth and backoff (torch.amp.GradScaler's
// rules, by known numbers and against a torch.amp.GradScaler trajectory,
// tests/golden/make_grad_scaler_golden.py), skipped steps leaving parameters and optimizer state untouched,
// exactness in f32 (a run with the scaler bit-identical to one without), two optimizers on one
// scaler, the warning after many skipped steps, state_dict, and every misuse as an nd::Error.
#include <cmath>
#include <limits>

#include "engine/optim/grad_scaler.h"
#include "harness.h"

using namespace nd;
using nd::optim::GradScaler;
using nd::optim::GradScalerOptions;
using nd::testing::error_message;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A parameter and an SGD optimizer over it; grad() sets its gradient (already "scaled").
struct One {
  Tensor p = tensor({1.0, 2.0, 3.0}).requires_grad_();
  optim::SGD opt{std::vector<Tensor>{p}, optim::SGDOptions(0.5)};
  void grad(std::vector<double> g) { p.set_grad(tensor(g)); }
};

// One iteration of the scaler on `one` with the given scaled gradient; returns whether it stepped.
bool iterate(GradScaler& s, One& one, std::vector<double> g) {
  one.grad(std::move(g));
  const bool stepped = s.step(one.opt);
  s.update();
  return stepped;
}

// A small MLP trained `steps` steps with Adam, with or without a scaler; returns the parameters.
std::vector<Tensor> train_mlp(bool with_scaler, int steps) {
  manual_seed(7);
  nn::Sequential model(nn::Linear(nn::LinearOptions(5, 8)), nn::Tanh(), nn::Linear(nn::LinearOptions(8, 3)));
  optim::Adam opt(model->parameters(), optim::AdamOptions(1e-2));
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(2));
  const Tensor x = randn({16, 5}), y = randn({16, 3});
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    const Tensor loss = mse_loss(model(x), y);
    if (with_scaler) {
      scaler.scale(loss).backward();
      REQUIRE(scaler.step(opt));
      scaler.update();
    } else {
      loss.backward();
      opt.step();
    }
  }
  if (with_scaler) CHECK(scaler.get_scale() == 1024.0 * 2 * 2);  // grown after steps 2 and 4
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("GradScaler: scale() multiplies the loss, its gradient carries the scale") {
  GradScaler s;
  CHECK(s.get_scale() == 65536.0);
  Tensor w = tensor({2.0, -3.0}).requires_grad_();
  const Tensor loss = (w * w).sum();
  const Tensor scaled = s.scale(loss);
  CHECK(scaled.item() == doctest::Approx(13.0 * 65536));
  scaled.backward();
  CHECK(nd::testing::to_floats(w.grad()) == std::vector<float>{4.0f * 65536, -6.0f * 65536});
}

TEST_CASE("GradScaler: step unscales, skips on inf or NaN, and the scale follows PyTorch's rules") {
  One one;
  GradScaler s(GradScalerOptions().init_scale(8.0).growth_interval(3));
  // A good step: the gradient is divided by 8 before SGD (lr 0.5) uses it.
  CHECK(iterate(s, one, {8.0, 16.0, -8.0}));
  CHECK(nd::testing::to_floats(one.p) == std::vector<float>{0.5f, 1.0f, 3.5f});
  CHECK(s.get_scale() == 8.0);
  CHECK(s.growth_tracker() == 1);
  // inf, then NaN: skipped, the parameter untouched, the scale halved each time, the count
  // of good steps restarted.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  CHECK_FALSE(iterate(s, one, {1.0, inf, 1.0}));
  CHECK(nd::testing::to_floats(one.p) == std::vector<float>{0.5f, 1.0f, 3.5f});
  CHECK(s.get_scale() == 4.0);
  CHECK(s.growth_tracker() == 0);
  CHECK_FALSE(iterate(s, one, {nan, 1.0, 1.0}));
  CHECK(s.get_scale() == 2.0);
  CHECK(s.skipped_in_a_row() == 2);
  // Three good steps in a row double it; the third resets the count.
  CHECK(iterate(s, one, {2.0, 2.0, 2.0}));
  CHECK(iterate(s, one, {2.0, 2.0, 2.0}));
  CHECK(s.get_scale() == 2.0);
  CHECK(s.growth_tracker() == 2);
  CHECK(s.skipped_in_a_row() == 0);
  CHECK(iterate(s, one, {2.0, 2.0, 2.0}));
  CHECK(s.get_scale() == 4.0);
  CHECK(s.growth_tracker() == 0);
  CHECK(nd::testing::to_floats(one.p) == std::vector<float>{-1.0f, -0.5f, 2.0f});
}

TEST_CASE("GradScaler: two optimizers on one scaler follow torch.amp.GradScaler's trajectory") {
  // The script's case: p with Adam, q with SGD + momentum, one scaler (1024, interval 2);
  // p's loss inf at steps 2 and 3, q's NaN at step 5. f64, so the values agree to rounding.
  const auto golden =
      nd::testing::read_golden_table(std::string(NANODDP_SOURCE_DIR) + "/tests/golden/grad_scaler_golden.txt");
  Tensor p = tensor({0.5, -1.0, 2.0}, kFloat64).requires_grad_(), q = tensor({1.0, 0.25}, kFloat64).requires_grad_();
  optim::Adam opt_a(std::vector<Tensor>{p}, optim::AdamOptions(0.1).betas({0.5, 0.999}));
  optim::SGD opt_b(std::vector<Tensor>{q}, optim::SGDOptions(0.05).momentum(0.9));
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(2));
  int steps = 0;
  for (int t = 1; golden.count(std::to_string(t)); ++t) {
    // Row t: scale after update(), stepped a, stepped b, p (3), q (2).
    const std::vector<double>& row = golden.at(std::to_string(t));
    REQUIRE(row.size() == 8);
    CAPTURE(t);
    opt_a.zero_grad();
    opt_b.zero_grad();
    const Tensor c = tensor({0.1 * t, -0.2, 0.3 * (t % 2 ? -1 : 1)}, kFloat64);
    const double fa = t == 2 || t == 3 ? std::numeric_limits<double>::infinity() : 1.0;
    const double fb = t == 5 ? std::nan("") : 1.0;
    scaler.scale((p * c * (p * c)).sum() * fa).backward();
    scaler.scale(((q - 0.1 * t) * (q - 0.1 * t)).sum() * fb).backward();
    CHECK(scaler.step(opt_a) == (row[1] == 1));
    CHECK(scaler.step(opt_b) == (row[2] == 1));
    scaler.update();
    CHECK(scaler.get_scale() == row[0]);
    nd::testing::check_close(p, {row[3], row[4], row[5]}, 1e-12, 1e-12, "p");
    nd::testing::check_close(q, {row[6], row[7]}, 1e-12, 1e-12, "q");
    ++steps;
  }
  CHECK(steps == 8);
}

TEST_CASE("GradScaler: a skipped step leaves Adam's state as it was") {
  Tensor p = tensor({1.0, -1.0}).requires_grad_();
  optim::Adam opt(std::vector<Tensor>{p}, optim::AdamOptions(0.1));
  GradScaler s(GradScalerOptions().init_scale(4.0));
  p.set_grad(tensor({4.0, 4.0}));
  REQUIRE(s.step(opt));
  s.update();
  const TensorDict before = opt.state_dict();
  const std::vector<float> p_before = nd::testing::to_floats(p);
  p.set_grad(tensor({std::numeric_limits<double>::infinity(), 1.0}));
  CHECK_FALSE(s.step(opt));
  s.update();
  CHECK(nd::testing::to_floats(p) == p_before);
  const TensorDict after = opt.state_dict();
  REQUIRE(after.size() == before.size());
  for (const auto& [k, v] : before) CHECK_MESSAGE(nd::testing::to_vector(after.at(k)) == nd::testing::to_vector(v), k);
}

TEST_CASE("GradScaler: in f32, training with the scaler is bit-identical to training without it") {
  // The scale is a power of two, so every gradient is exactly scale times the unscaled one
  // and unscaling restores it exactly (nothing overflows here).
  const auto plain = train_mlp(false, 5), scaled = train_mlp(true, 5);
  REQUIRE(plain.size() == scaled.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(nd::testing::to_floats(plain[i]) == nd::testing::to_floats(scaled[i]));
}

TEST_CASE("GradScaler: two optimizers, one skipped: the other steps, and the scale backs off for both") {
  One a, b;
  GradScaler s(GradScalerOptions().init_scale(2.0));
  a.grad({2.0, 2.0, 2.0});
  b.grad({std::numeric_limits<double>::infinity(), 0.0, 0.0});
  CHECK(s.step(a.opt));
  CHECK_FALSE(s.step(b.opt));
  s.update();
  CHECK(nd::testing::to_floats(a.p) == std::vector<float>{0.5f, 1.5f, 2.5f});
  CHECK(nd::testing::to_floats(b.p) == std::vector<float>{1.0f, 2.0f, 3.0f});
  CHECK(s.get_scale() == 1.0);
}

TEST_CASE("GradScaler: unscale_ before step lets the caller see (and clip) unscaled gradients") {
  One one;
  GradScaler s(GradScalerOptions().init_scale(4.0));
  one.grad({4.0, 8.0, 12.0});
  s.unscale_(one.opt);
  CHECK(nd::testing::to_floats(one.p.grad()) == std::vector<float>{1.0f, 2.0f, 3.0f});
  one.p.grad().mul_(0.5);  // "clipping"
  CHECK(s.step(one.opt));   // does not unscale again
  s.update();
  CHECK(nd::testing::to_floats(one.p) == std::vector<float>{0.75f, 1.5f, 2.25f});
}

TEST_CASE("GradScaler: an unscale_ without its step() still counts in update()") {
  One one;
  GradScaler s(GradScalerOptions().init_scale(8.0));
  one.grad({std::numeric_limits<double>::infinity(), 0.0, 0.0});
  s.unscale_(one.opt);  // the caller looks, sees the inf, and does not step
  s.update();
  CHECK(s.get_scale() == 4.0);
  CHECK(nd::testing::to_floats(one.p) == std::vector<float>{1.0f, 2.0f, 3.0f});
}

TEST_CASE("GradScaler: the scale stops growing where it would overflow") {
  One one;
  GradScaler s(GradScalerOptions().init_scale(std::numeric_limits<double>::max()).growth_interval(1));
  CHECK(iterate(s, one, {0.0, 0.0, 0.0}));
  CHECK(s.get_scale() == std::numeric_limits<double>::max());
}

TEST_CASE("GradScaler: steps skipped in a row warn once, naming the non-finite gradient (story 9)") {
  nd::testing::WarningCapture warnings;
  One one;
  one.p.set_name("head.weight");
  GradScaler s;
  for (int64_t i = 0; i < GradScaler::kWarnAfterSkips + 5; ++i) {
    CHECK_FALSE(iterate(s, one, {std::nan(""), 0.0, 0.0}));
    CHECK(warnings.messages.size() == (i + 1 >= GradScaler::kWarnAfterSkips ? 1u : 0u));
  }
  REQUIRE(warnings.messages.size() == 1);
  const std::string& m = warnings.messages[0];
  CHECK(contains(m, "last 20 optimizer steps were all skipped"));
  CHECK(contains(m, "head.weight"));
  CHECK(contains(m, "in SGD"));
  CHECK(contains(m, "no longer trains"));
}

TEST_CASE("GradScaler: state_dict round trip with PyTorch's keys") {
  One one;
  GradScaler a(GradScalerOptions().init_scale(16.0).growth_interval(5));
  CHECK(iterate(a, one, {1.0, 1.0, 1.0}));
  CHECK(iterate(a, one, {1.0, 1.0, 1.0}));
  const TensorDict sd = a.state_dict();
  CHECK(sd.size() == 5);
  CHECK(sd.at("scale").item() == 16.0);
  CHECK(sd.at("_growth_tracker").item() == 2.0);
  CHECK(sd.at("growth_interval").item() == 5.0);
  GradScaler b;
  b.load_state_dict(sd);
  CHECK(b.get_scale() == 16.0);
  CHECK(b.growth_tracker() == 2);
  for (int i = 0; i < 3; ++i) CHECK(iterate(b, one, {1.0, 1.0, 1.0}));
  CHECK(b.get_scale() == 32.0);  // the interval of 5 came with the state

  TensorDict missing = sd;
  missing.erase("backoff_factor");
  CHECK(contains(error_message([&] { b.load_state_dict(missing); }), "missing key 'backoff_factor'"));
  TensorDict bad = sd;
  bad["_growth_tracker"] = scalar_tensor(9.0, kFloat64);
  CHECK(contains(error_message([&] { b.load_state_dict(bad); }), "expected _growth_tracker in [0, growth_interval)"));
  bad["scale"] = tensor({1.0, 2.0}, kFloat64);
  CHECK(contains(error_message([&] { b.load_state_dict(bad); }), "expected one value for 'scale'"));
}

TEST_CASE("GradScaler: disabled, every call passes through") {
  One one;
  GradScaler s(GradScalerOptions().enabled(false));
  const Tensor loss = tensor({3.0});
  CHECK(s.scale(loss).impl_ptr() == loss.impl_ptr());
  CHECK(s.get_scale() == 1.0);
  CHECK(iterate(s, one, {2.0, 2.0, 2.0}));
  CHECK(nd::testing::to_floats(one.p) == std::vector<float>{0.0f, 1.0f, 2.0f});
  CHECK(s.state_dict().empty());
}

TEST_CASE("GradScaler: misuse is an nd::Error that says what to do") {
  CHECK(contains(error_message([] { GradScaler(GradScalerOptions().init_scale(0)); }), "expected init_scale > 0"));
  CHECK(contains(error_message([] { GradScaler(GradScalerOptions().growth_factor(1.0)); }),
                 "expected growth_factor > 1"));
  CHECK(contains(error_message([] { GradScaler(GradScalerOptions().backoff_factor(1.0)); }),
                 "expected backoff_factor in (0, 1)"));
  CHECK(contains(error_message([] { GradScaler(GradScalerOptions().growth_interval(0)); }),
                 "expected growth_interval >= 1"));

  One one;
  GradScaler s;
  CHECK(contains(error_message([&] { s.update(); }), "no step() or unscale_() since the last update()"));
  one.grad({1.0, 1.0, 1.0});
  s.unscale_(one.opt);
  CHECK(contains(error_message([&] { s.unscale_(one.opt); }), "already called on SGD since the last update()"));
  s.step(one.opt);
  CHECK(contains(error_message([&] { s.step(one.opt); }), "GradScaler.step: already called on SGD"));
  CHECK(contains(error_message([&] { s.unscale_(one.opt); }), "already called on SGD"));
  s.update();
  CHECK(contains(error_message([&] { s.scale(Tensor()); }), "expected a loss tensor"));
  CHECK(contains(error_message([&] { s.scale(tensor({1.0}, kInt64)); }), "expected a floating point loss"));
}
