// Anomaly mode (engine/anomaly_mode.h): a backward node that returns NaN or inf stops
// backward with an error naming the node, the tensor, the user's line (asserted with
// __LINE__ in this file) and the first non-finite forward output; off by default, where
// NaN propagates unchecked; the guard restores the previous state.
#include <cmath>
#include <source_location>

#include "harness.h"

using namespace nd;
using nd::testing::error_message;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// "<this file>:<line>", as a call site on that line of this file names itself.
std::string here(int line) { return std::string(std::source_location::current().file_name()) + ":" + std::to_string(line); }

bool any_nan(const Tensor& t) {
  for (double v : nd::testing::to_vector(t))
    if (std::isnan(v)) return true;
  return false;
}

// One DCGAN generator step with the minimax generator loss log(1 - D(G(z))), against a
// discriminator made over-confident (its last layer's weights times 1e4): some logit is
// above ~17, sigmoid rounds it to exactly 1 in f32, and the loss takes log(0).
struct GanStep {
  models::DCGANGenerator G{8, 4};
  models::DCGANDiscriminator D{4};
  GanStep() {
    manual_seed(7);
    models::dcgan_init(*G);
    models::dcgan_init(*D);
    NoGradGuard no_grad;
    for (auto& [name, p] : D->named_parameters())
      if (name == "main.5.weight") p.mul_(full(p.sizes(), 1e4, p.options()));
  }
  Tensor d_fake() { return D->forward(G->forward(randn({4, 8}))); }
};

}  // namespace

TEST_CASE("anomaly mode: a GAN step with log(0) in the generator's loss points at that line") {
  autograd::DetectAnomalyGuard anomaly;
  GanStep step;
  const Tensor d_fake = step.d_fake();
  bool saturated = false;
  for (double p : nd::testing::to_vector(sigmoid(d_fake.detach()))) saturated |= p == 1.0;
  REQUIRE_MESSAGE(saturated, "the test needs a logit that sigmoid rounds to 1");
  const int loss_line = __LINE__ + 1;
  const Tensor loss_g = nd::log(1.0 - nd::sigmoid(d_fake)).mean();
  const std::string msg = error_message([&] { loss_g.backward(); });
  INFO(msg);
  CHECK(contains(msg, "Function 'LogBackward' returned inf values in its 0th output (the gradient for its input "
                      "[cpu f32 [4]])."));
  CHECK(contains(msg, "Forward call that created it: " + here(loss_line) + " in "));
  CHECK(contains(msg, "First forward op of this graph with a non-finite output: the forward of LogBackward at " +
                          here(loss_line)));
  CHECK(contains(msg, "made -inf in output 0 [cpu f32 [4]]"));
  for (const Tensor& p : step.G->parameters()) CHECK_FALSE(p.grad().defined());  // stopped before G
}

TEST_CASE("anomaly mode off (the default): no check, the NaN reaches the generator as before") {
  CHECK_FALSE(autograd::is_anomaly_enabled());
  GanStep step;
  const Tensor loss_g = nd::log(1.0 - nd::sigmoid(step.d_fake())).mean();
  loss_g.backward();
  bool nan = false;
  for (const Tensor& p : step.G->parameters()) nan |= any_nan(p.grad());
  CHECK(nan);  // inf from LogBackward times sigmoid's 0 derivative
}

TEST_CASE("anomaly mode: the error names the node, the tensor and the line, and that forward outputs were finite") {
  autograd::DetectAnomalyGuard anomaly;
  const Tensor x = tensor({1.0, 0.0, 4.0}).requires_grad_().set_name("x");
  const int line = __LINE__ + 1;
  const Tensor y = nd::sqrt(x);
  const std::string msg = error_message([&] { y.sum().backward(); });
  CHECK(contains(msg, "Function 'SqrtBackward' returned inf values in its 0th output (the gradient for its input "
                      "[cpu f32 [3]] 'x')."));
  CHECK(contains(msg, "Forward call that created it: " + here(line)));
  CHECK(contains(msg, "Every forward output of this graph recorded in anomaly mode was finite."));
}

TEST_CASE("anomaly mode: the first non-finite forward op is reported beside the failing node") {
  autograd::DetectAnomalyGuard anomaly;
  const Tensor x = tensor({1000.0}).requires_grad_().set_name("x");
  const Tensor w = tensor({2.0}).requires_grad_().set_name("w");
  const int exp_line = __LINE__ + 1;
  const Tensor a = nd::exp(x);  // inf: exp(1000) overflows f32
  const int mul_line = __LINE__ + 1;
  const Tensor b = nd::mul(a, w);
  const std::string msg = error_message([&] { b.sum().backward(); });
  // dL/dw = a = inf; dL/da = w = 2 is finite, so MulBackward's 1st output fails.
  CHECK(contains(msg, "Function 'MulBackward' returned inf values in its 1th output (the gradient for its input "
                      "[cpu f32 [1]] 'w')."));
  CHECK(contains(msg, "Forward call that created it: " + here(mul_line)));
  CHECK(contains(msg, "the forward of ExpBackward at " + here(exp_line)));
  CHECK(contains(msg, "made inf in output 0 [cpu f32 [1]]"));
}

TEST_CASE("anomaly mode: NaN is named nan, operators and Tensor methods report the enclosing call site") {
  autograd::DetectAnomalyGuard anomaly;
  const Tensor x = tensor({0.0, 1.0}).requires_grad_().set_name("x");
  const Tensor zero = zeros({2});
  // An operator and a member outside any nd:: call: no call site (library calls never claim one).
  const Tensor y = x.log() / zero;
  const std::string none = error_message([&] { y.sum().backward(); });
  CHECK(contains(none, "Function 'DivBackward'"));
  CHECK(contains(none, "Forward call that created it: not recorded (an operator or module call"));
  CHECK(contains(none, "the forward of LogBackward at not recorded"));
  // Inside an explicit call site every op in the scope reports its line.
  const Tensor b = zeros({2}).requires_grad_().set_name("b");
  Tensor z;
  int line = 0;
  {
    line = __LINE__ + 1;
    const autograd::CallSite site;
    z = zero / b;  // d(a / b)/db = -a / b^2 = 0 / 0 at b = 0
  }
  const std::string named = error_message([&] { z.sum().backward(); });
  CHECK(contains(named, "Function 'DivBackward' returned nan values in its 1th output (the gradient for its input "
                        "[cpu f32 [2]] 'b')."));
  CHECK(contains(named, "Forward call that created it: " + here(line)));
  // Ops on the same line as an nd:: call, run while it is open, share its line.
  const int same_line = __LINE__ + 1;
  const Tensor s = nd::exp(x) / zero;
  CHECK(contains(error_message([&] { s.sum().backward(); }), "Forward call that created it: " + here(same_line)));
}

TEST_CASE("anomaly mode: other backward errors gain the node's forward call site") {
  autograd::DetectAnomalyGuard anomaly;
  const Tensor w = tensor({1.0, 2.0}).requires_grad_().set_name("w");
  const Tensor h = w * 2.0;
  const int line = __LINE__ + 1;
  const Tensor loss = nd::mul(h, h).sum();
  {
    NoGradGuard no_grad;
    h.add_(ones({2}));  // invalidates what MulBackward saved
  }
  const std::string msg = error_message([&] { loss.backward(); });
  CHECK(contains(msg, "modified by an inplace operation"));
  CHECK(contains(msg, "Forward call that created MulBackward: " + here(line)));
}

TEST_CASE("DetectAnomalyGuard restores the previous state, nested") {
  CHECK_FALSE(autograd::is_anomaly_enabled());
  {
    autograd::DetectAnomalyGuard outer;
    CHECK(autograd::is_anomaly_enabled());
    autograd::set_detect_anomaly(false);
    {
      autograd::DetectAnomalyGuard inner;
      CHECK(autograd::is_anomaly_enabled());
    }
    CHECK_FALSE(autograd::is_anomaly_enabled());  // inner restored outer's "off"
    autograd::set_detect_anomaly(true);
  }
  CHECK_FALSE(autograd::is_anomaly_enabled());
  // Off: nothing is recorded on the node.
  const Tensor x = tensor({1.0}).requires_grad_();
  CHECK(nd::log(x).grad_fn()->anomaly == nullptr);
  autograd::DetectAnomalyGuard on;
  CHECK(nd::log(x).grad_fn()->anomaly != nullptr);
}
