// Autograd engine: the user stories' errors (1, 2, 3, 8), retain_graph, grad(),
// hooks, and freedom from reference cycles.
#include "harness.h"

using namespace nd;
using nd::testing::check_close;
using nd::testing::error_message;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A toy "discriminator": sigmoid(sum(x * w, dim 1)).
Tensor D(const Tensor& x, const Tensor& w) { return sigmoid((x * w).sum({1})); }
}  // namespace

TEST_CASE("story 1: backward through a freed graph names the node, retain_graph works") {
  Tensor w = tensor({1, 2, 3}, kFloat64).requires_grad_().set_name("G.fc.weight");
  Tensor x = tensor({0.5, -1, 2}, kFloat64);
  Tensor loss = (x * w).sum();
  loss.backward();
  const std::string msg = error_message([&] { loss.backward(); });
  CHECK(contains(msg, "Trying to backward through the graph a second time"));
  CHECK(contains(msg, "Specify retain_graph=true"));
  CHECK(contains(msg, "MulBackward"));

  Tensor v = tensor({1, 2, 3}, kFloat64).requires_grad_();
  Tensor l2 = (x * v).sum();
  l2.backward(Tensor(), /*retain_graph=*/true);
  l2.backward();  // a second pass accumulates
  check_close(v.grad(), {1, -2, 4}, 0, 0, "accumulated over two backward calls");
}

TEST_CASE("story 2: stepping D before G's backward is caught, naming the parameter and the optimizer") {
  Tensor w_d = tensor({0.1, 0.2, 0.3}, kFloat64).requires_grad_().set_name("D.main.0.weight");
  Tensor w_g = tensor({1, 1, 1}, kFloat64).requires_grad_().set_name("G.main.0.weight");
  Tensor z = tensor({0.5, 0.6, 0.7}, kFloat64).reshape({1, 3});
  Tensor fake = z * w_g;                       // G(z)
  Tensor d_loss = D(fake.detach(), w_d).sum();  // D's loss on fake
  Tensor g_loss = -log(D(fake, w_d)).sum();     // G's loss through D (saves w_d)
  d_loss.backward();
  {
    NoGradGuard no_grad;
    ops::InplaceOpLabel label("Adam.step");
    w_d.sub_(w_d.grad(), 0.1);  // the optimizer step on D
  }
  const std::string msg = error_message([&] { g_loss.backward(); });
  CHECK(contains(msg, "one of the variables needed for gradient computation has been modified by an inplace "
                      "operation: [cpu f64 [3]] 'D.main.0.weight', saved by MulBackward, is at version 1; "
                      "expected version 0 instead. It was last modified by Adam.step."));
  CHECK(contains(msg, "Hint: "));
  // Doing it in the right order works: both backwards before the step.
  Tensor fake2 = z * w_g;
  Tensor g2 = -log(D(fake2, w_d)).sum();
  g2.backward();
  CHECK(w_g.grad().defined());
}

TEST_CASE("story 3: backward from something that does not require grad") {
  Tensor w = tensor({1, 2}, kFloat64).requires_grad_().set_name("net.weight");
  Tensor loss;
  {
    NoGradGuard no_grad;
    loss = (w * 2.0).sum();
  }
  std::string msg = error_message([&] { loss.backward(); });
  CHECK(contains(msg, "element 0 of tensors does not require grad and does not have a grad_fn"));
  CHECK(contains(msg, "NoGradGuard or by detach()"));
  msg = error_message([&] { (w * 2.0).sum().detach().backward(); });
  CHECK(contains(msg, "element 0 of tensors does not require grad"));
  CHECK(contains(error_message([] { ones({2}).sum().backward(); }), "call requires_grad_(true)"));

  // The user's "fix": requires_grad_(true) on the no-grad loss. It runs, reaches no
  // parameter, and we warn that nothing will train.
  nd::testing::WarningCapture warnings;
  loss.requires_grad_(true);
  loss.backward();
  REQUIRE(warnings.messages.size() == 1);
  CHECK(contains(warnings.messages[0], "no parameter will receive a gradient"));
  CHECK_FALSE(w.grad().defined());
  // A fresh leaf marked requires_grad is not warned about.
  Tensor x = ones({2}).requires_grad_();
  x.sum().backward();
  CHECK(warnings.messages.size() == 1);
}

TEST_CASE("story 8: .grad of a tensor that never received one explains why") {
  Tensor plain = ones({2}).set_name("plain");
  std::string msg = error_message([&] { plain.grad().sum(); });
  CHECK(contains(msg, "does not require grad"));
  CHECK(contains(msg, "'plain'"));

  Tensor w = ones({2}).requires_grad_().set_name("w");
  Tensor h = (w * 3.0).set_name("h");
  h.sum().backward();
  msg = error_message([&] { h.grad().numel(); });
  CHECK(contains(msg, "not a leaf"));
  CHECK(contains(msg, "retain_grad()"));

  Tensor out;
  {
    NoGradGuard no_grad;
    out = w * 2.0;
  }
  CHECK(contains(error_message([&] { out.grad().numel(); }), "produced under NoGradGuard"));
  Tensor fresh = ones({2}).requires_grad_();
  CHECK(contains(error_message([&] { fresh.grad().numel(); }), "no gradient has reached it yet"));
}

TEST_CASE("story 8: a parameter whose module ran under NoGradGuard says so when its .grad is missing") {
  manual_seed(1);
  nn::Linear D(nn::LinearOptions(3, 2));
  D->weight.set_name("D.weight");
  const Tensor x = randn({4, 3});
  {
    NoGradGuard no_grad;  // e.g. a discriminator scored in evaluation code, then its loss backpropagated
    D(x).sum();
  }
  const std::string msg = error_message([&] { D->weight.grad().numel(); });
  CHECK(contains(msg, "'D.weight'"));
  CHECK(contains(msg, "the last op that read it ran with grad mode off (under NoGradGuard"));
  // A forward with grad mode on and its backward give the gradient; once cleared, the
  // message is the plain one again.
  D(x).sum().backward();
  CHECK(D->weight.grad().defined());
  D->zero_grad();
  CHECK(contains(error_message([&] { D->weight.grad().numel(); }), "no gradient has reached it yet"));
  // An optimizer step reads and writes the parameters under no-grad: a write is not a read
  // that lost the gradient.
  optim::SGD sgd(D->parameters(), optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
  D(x).sum().backward();
  sgd.step();
  D->zero_grad();
  const std::string after_step = error_message([&] { D->weight.grad().numel(); });
  CHECK(contains(after_step, "no gradient has reached it yet"));
  CHECK(!contains(after_step, "grad mode off"));
}

TEST_CASE("autograd: shared inputs, retain_grad, grad(), post-accumulate hooks") {
  Tensor x = tensor({1, 2, 3}, kFloat64).requires_grad_();
  Tensor y = x * x;  // used twice below: gradients from both uses add
  y.retain_grad();
  Tensor loss = (y * 2.0 + y).sum();
  std::vector<double> seen;
  x.register_post_accumulate_grad_hook([&](const Tensor& t) { seen = nd::testing::to_vector(t.grad()); });
  loss.backward();
  check_close(x.grad(), {6, 12, 18}, 1e-12, 0, "d/dx 3x^2");
  check_close(y.grad(), {3, 3, 3}, 1e-12, 0, "retained d/dy");
  CHECK(seen == std::vector<double>{6, 12, 18});

  Tensor a = tensor({2}, kFloat64).requires_grad_();
  Tensor b = tensor({5}, kFloat64).requires_grad_();
  auto g = autograd::grad({(a * a * b).sum()}, {a, b});
  check_close(g[0], {20}, 1e-12, 0, "d(a^2 b)/da");
  check_close(g[1], {4}, 1e-12, 0, "d(a^2 b)/db");
  CHECK_FALSE(a.grad().defined());  // grad() never writes .grad
  Tensor unused = ones({1}, kFloat64).requires_grad_();
  CHECK(contains(error_message([&] { autograd::grad({(a * 2.0).sum()}, {unused}); }), "allow_unused"));
  CHECK(contains(error_message([&] { ones({3}).requires_grad_().mul(2.0).backward(); }),
                 "grad can be implicitly created only for scalar outputs"));
}

// Slices of one tensor: the first slice's gradient is a zero-filled tensor, each later one
// is added into that buffer's region in place (Node::apply_into). Overlapping slices,
// select, strided slices, a buffer that someone else also holds (then the usual add).
TEST_CASE("autograd: gradients of several slices of one tensor add up, in place or not") {
  const Tensor x = tensor({1, 2, 3, 4, 5, 6, 7, 8}, kFloat64).reshape({4, 2}).requires_grad_();
  const Tensor h = x * 1.0;
  const Tensor w = tensor({1, 10}, kFloat64);
  Tensor loss = (h.slice(0, 0, 3) * w).sum() + (h.slice(0, 1, 4) * 2.0).sum() + (h.select(0, 2) * 3.0).sum() +
                (h.slice(0, 0, 4, 2) * w * 5.0).sum() + h.narrow(1, 1, 1).sum();
  loss.backward();
  // d/dh per row: [1, 10] (rows 0-2) + 2 (rows 1-3) + 3 (row 2) + [5, 50] (rows 0, 2) + [0, 1]
  check_close(x.grad(), {6, 61, 3, 13, 11, 66, 2, 3}, 0, 0, "slices' gradients");
  // A buffer that is also the root gradient the caller holds: not modified in place.
  const Tensor y = tensor({1, 2, 3}, kFloat64).requires_grad_();
  const Tensor t = y * 1.0;
  const Tensor root = tensor({1, 1, 1}, kFloat64);
  Tensor out = t + t.slice(0, 1, 3).sum();  // t's buffer: `root` itself, then a slice's gradient
  out.backward(root);
  check_close(root, {1, 1, 1}, 0, 0, "the caller's gradient is left alone");
  check_close(y.grad(), {1, 4, 4}, 0, 0, "d/dy");
}

TEST_CASE("autograd: no reference cycles, saved tensors are freed after backward") {
  const int64_t before = Storage::live_count();
  {
    Tensor w = randn({4, 3}, kFloat64).requires_grad_();
    Tensor b = zeros({3}, kFloat64).requires_grad_();
    for (int step = 0; step < 3; ++step) {
      Tensor x = randn({4, 3}, kFloat64);
      Tensor h = tanh(x * w + b);
      Tensor loss = (h * h).mean() + exp(h).sum({0}).max();
      const int64_t during = Storage::live_count();
      loss.backward();
      NoGradGuard no_grad;
      w.sub_(w.grad(), 0.1);
      b.sub_(b.grad(), 0.1);
      w.set_grad(Tensor());
      b.set_grad(Tensor());
      CHECK(Storage::live_count() < during);  // saved intermediates were released by backward
    }
  }
  CHECK(Storage::live_count() == before);
  {
    Tensor w = ones({2}).requires_grad_();
    Tensor loss = (exp(w) * w).sum();  // never backwarded: the graph dies with its handles
  }
  CHECK(Storage::live_count() == before);
}

TEST_CASE("autograd: in-place on a view of a grad-requiring tensor and on leaves is refused") {
  Tensor w = ones({2, 2}).requires_grad_();
  Tensor h = w * 2.0;
  CHECK(contains(error_message([&] { h.narrow(0, 0, 1).add_(1.0); }), "not supported on views"));
  CHECK(contains(error_message([&] { h.mul_(h); }), "not supported in place"));
  NoGradGuard no_grad;
  w.add_(1.0);  // an optimizer-style update under no-grad is fine
  CHECK(w._version() == 1);
}
