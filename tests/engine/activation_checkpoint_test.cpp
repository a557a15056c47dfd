// nd::checkpoint: gradients bit for bit those of the plain run (f64, with dropout, with
// parameters and closed-over tensors outside the inputs, under autocast), the generator
// left as the plain run leaves it, one AccumulateGrad (and hook) per parameter (a weight
// used inside and outside too, anomaly mode on or off), and the
// errors: undefined or no outputs, a second backward, an input changed in place, a
// recomputation that reads another tensor.
#include "harness.h"

using namespace nd;
using nd::testing::bitwise_equal;
using nd::testing::error_message;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Linear, GELU, Dropout, Linear: a residual block with parameters outside its inputs.
struct Block : nn::Module {
  nn::Linear fc1{nn::LinearOptions(6, 12)}, fc2{nn::LinearOptions(12, 6)};
  nn::GELU act;
  nn::Dropout drop{nn::DropoutOptions(0.3)};
  Block() : nn::Module("Block") {
    register_module("fc1", fc1);
    register_module("act", act);
    register_module("drop", drop);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override { return x + fc2(drop(act(fc1(x)))); }
};

struct Net : nn::Module {
  std::vector<std::shared_ptr<Block>> blocks;
  nn::Linear head{nn::LinearOptions(6, 1)};
  Net() : nn::Module("Net") {
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(std::make_shared<Block>());
      register_module("block" + std::to_string(i), blocks.back());
    }
    register_module("head", head);
  }
  Tensor run(const Tensor& x, bool use_checkpoint) {
    Tensor h = x;
    for (auto& b : blocks) h = use_checkpoint ? checkpoint([b](const Tensor& in) { return b->forward(in); }, h) : b->forward(h);
    return head(h).pow(2).mean();
  }
};

struct Run {
  Tensor loss, x_grad, after;  // after: a draw from the generator once backward is done
  std::vector<Tensor> grads;
};

Run run_net(bool use_checkpoint, ScalarType dtype) {
  manual_seed(7);
  Net net;
  net.to(dtype);
  Tensor x = randn({5, 6}, dtype).requires_grad_();
  Run r;
  r.loss = net.run(x, use_checkpoint);
  r.loss.backward();
  r.x_grad = x.grad();
  for (auto& [name, p] : net.named_parameters()) r.grads.push_back(p.grad());
  r.after = rand({4}, kFloat64);
  return r;
}

void check_same(const Run& a, const Run& b) {
  CHECK(bitwise_equal(a.loss, b.loss));
  CHECK(bitwise_equal(a.x_grad, b.x_grad));
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(a.grads[i], b.grads[i]));
  }
  CHECK(bitwise_equal(a.after, b.after));
}
}  // namespace

TEST_CASE("checkpoint: gradients bit for bit those of the plain run in f64, with dropout") {
  const Run plain = run_net(false, kFloat64), ck = run_net(true, kFloat64);
  check_same(plain, ck);
  // Dropout drew its masks: the same seed without dropout gives another loss.
  manual_seed(7);
  Net net;
  net.to(kFloat64);
  net.train(false);
  Tensor x = randn({5, 6}, kFloat64);
  CHECK(!bitwise_equal(net.run(x, false), plain.loss));
}

TEST_CASE("checkpoint: f32, several inputs and outputs, a closed-over non-leaf tensor") {
  for (bool use_checkpoint : {false, true}) {
    CAPTURE(use_checkpoint);
    static Tensor results[2][4];
    manual_seed(3);
    Tensor a = randn({3, 4}).requires_grad_(), b = randn({4, 2}).requires_grad_();
    Tensor s = randn({2}).requires_grad_(), c = randn({3, 4});  // c requires no grad
    Tensor scale = s * 2;                                     // non-leaf, read inside fn only
    auto fn = [scale](const std::vector<Tensor>& in) {
      Tensor m = matmul(in[0] * in[2], in[1]);
      return std::vector<Tensor>{tanh(m) * scale, m.sum({1})};
    };
    std::vector<Tensor> out = use_checkpoint ? checkpoint(fn, {a, b, c}) : fn({a, b, c});
    if (use_checkpoint) {
      CHECK(out[0].grad_fn()->name() == "CheckpointBackward");
      CHECK(out[1].grad_fn() == out[0].grad_fn());
    }
    (out[0].pow(2).sum() + out[1].sum() * 3).backward();
    Tensor* r = results[use_checkpoint ? 1 : 0];
    r[0] = a.grad(), r[1] = b.grad(), r[2] = s.grad(), r[3] = out[0].detach();
    if (use_checkpoint)
      for (int i = 0; i < 4; ++i) CHECK(bitwise_equal(results[0][i], results[1][i]));
  }
}

TEST_CASE("checkpoint: an output that is the input itself, and an output that needs no grad") {
  Tensor x = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor k = tensor({3.0, 4.0}, kFloat64);
  std::vector<Tensor> out = checkpoint([k](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0], k * 2}; },
                                       {x});
  CHECK(out[0].impl_ptr() != x.impl_ptr());
  CHECK(x.is_leaf());
  (out[0] * out[1]).sum().backward();
  CHECK(nd::testing::to_vector(x.grad()) == std::vector<double>{6, 8});
}

TEST_CASE("checkpoint: inputs that need no grad still give the parameters theirs, nothing needing grad gives no graph") {
  manual_seed(1);
  nn::Linear lin(nn::LinearOptions(3, 2));
  Tensor x = randn({4, 3});
  Tensor plain = lin(x).pow(2).sum();
  plain.backward();
  Tensor w_plain = lin->weight.grad().clone();
  lin->weight.grad().zero_();
  lin->bias.grad().zero_();
  Tensor y = checkpoint([&](const Tensor& in) { return lin(in); }, x);
  y.pow(2).sum().backward();
  CHECK(bitwise_equal(lin->weight.grad(), w_plain));

  Tensor u = checkpoint([](const Tensor& in) { return in * 2; }, x);
  CHECK(!u.requires_grad());
  CHECK(u.grad_fn() == nullptr);
  {
    NoGradGuard no_grad;  // grad mode off: fn runs plainly
    Tensor v = checkpoint([&](const Tensor& in) { return lin(in); }, x);
    CHECK(!v.requires_grad());
  }
}

TEST_CASE("checkpoint: each parameter's AccumulateGrad and post-accumulate hook run once") {
  manual_seed(2);
  Net net;
  std::map<std::string, int> fired;
  for (auto& [name, p] : net.named_parameters()) {
    std::string n = name;
    p.register_post_accumulate_grad_hook([&fired, n](const Tensor&) { ++fired[n]; });
  }
  net.run(randn({2, 6}).requires_grad_(), true).backward();
  CHECK(fired.size() == net.named_parameters().size());
  for (auto& [name, count] : fired) {
    CAPTURE(name);
    CHECK(count == 1);
  }
}

TEST_CASE("checkpoint: under autocast the recomputation runs in the forward's autocast state") {
  for (ScalarType dtype : {kBFloat16, kFloat16}) {
    CAPTURE(dtype_name(dtype));
    Tensor grads[2];
    for (bool use_checkpoint : {false, true}) {
      manual_seed(5);
      nn::Linear lin(nn::LinearOptions(8, 8));
      Tensor x = randn({4, 8}).requires_grad_();
      Tensor loss;
      {
        AutocastGuard autocast(kCPU, true, dtype);
        loss = (use_checkpoint ? checkpoint([&](const Tensor& in) { return lin(in); }, x) : lin(x)).pow(2).sum();
      }
      loss.backward();  // outside the guard: the recomputation must turn it back on
      grads[use_checkpoint ? 1 : 0] = lin->weight.grad();
    }
    CHECK(bitwise_equal(grads[0], grads[1]));
  }
  // And the f32 gradient differs, so the test can tell.
  manual_seed(5);
  nn::Linear lin(nn::LinearOptions(8, 8));
  Tensor x = randn({4, 8}).requires_grad_();
  lin(x).pow(2).sum().backward();
  Tensor f32 = lin->weight.grad();
  manual_seed(5);
  nn::Linear lin2(nn::LinearOptions(8, 8));
  Tensor x2 = randn({4, 8}).requires_grad_();
  Tensor loss;
  {
    AutocastGuard autocast(kCPU);
    loss = checkpoint([&](const Tensor& in) { return lin2(in); }, x2).pow(2).sum();
  }
  loss.backward();
  CHECK(!bitwise_equal(f32, lin2->weight.grad()));
}

TEST_CASE("checkpoint: retain_graph lets a second backward recompute again") {
  Tensor x = tensor({1.0, -2.0}, kFloat64).requires_grad_();
  Tensor y = checkpoint([](const Tensor& in) { return (in * in).sum(); }, x);
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  CHECK(nd::testing::to_vector(x.grad()) == std::vector<double>{4, -8});
}

TEST_CASE("checkpoint: errors") {
  Tensor x = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  CHECK(error_message([&] {
          checkpoint([](const std::vector<Tensor>&) { return std::vector<Tensor>{}; }, {x});
        }) == "checkpoint: the function returned no tensors; expected at least one");
  CHECK(error_message([&] {
          checkpoint([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2, Tensor()}; }, {x});
        }) == "checkpoint: output 1 of the function is an undefined tensor; expected every output to be a defined "
              "tensor");
  CHECK(error_message([&] { checkpoint(CheckpointFunction(), {x}); }) ==
        "checkpoint: expected a function, found an empty std::function");

  Tensor y = checkpoint([](const Tensor& in) { return (in * in).sum(); }, x);
  y.backward();
  const std::string twice = error_message([&] { y.backward(); });
  CHECK(contains(twice, "Trying to backward through the graph a second time"));
  CHECK(contains(twice, "CheckpointBackward"));

  Tensor z = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor h = z * 1;
  Tensor out = checkpoint([](const Tensor& in) { return (in * in).sum(); }, h);
  {
    NoGradGuard no_grad;
    h.add_(1);
  }
  const std::string changed = error_message([&] { out.backward(); });
  CHECK(contains(changed, "modified by an inplace operation"));
  CHECK(contains(changed, "saved by CheckpointBackward"));

  // A function that reads another tensor when it is run again.
  Tensor w1 = tensor({1.0, 1.0}, kFloat64).requires_grad_(), w2 = tensor({2.0, 2.0}, kFloat64).requires_grad_();
  int calls = 0;
  Tensor fickle = checkpoint([&](const Tensor& in) { return (in * (calls++ == 0 ? w1 : w2)).sum(); }, x);
  CHECK(contains(error_message([&] { fickle.backward(); }),
                 "checkpoint: the recomputation reached AccumulateGrad, a tensor that requires grad which the forward "
                 "under checkpoint did not read"));
  Tensor shapes = checkpoint([&](const Tensor& in) { return calls++ == 3 ? in.sum() : in * 1; }, x);
  CHECK(error_message([&] { shapes.sum().backward(); }) ==
        "checkpoint: output 0 of the recomputation is " + x.sum().describe() +
            "; the forward returned shape [2]");
}

TEST_CASE("checkpoint: a weight used inside and outside the function accumulates once, also in anomaly mode") {
  for (bool anomaly : {false, true}) {
    CAPTURE(anomaly);
    Tensor grads[2];
    int fired = 0;
    for (bool use_checkpoint : {false, true}) {
      Tensor w = tensor({0.5, -1.5, 2.0}, kFloat64).requires_grad_();
      w.register_post_accumulate_grad_hook([&](const Tensor&) { ++fired; });
      Tensor x = tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_();
      auto inner = [w](const Tensor& in) { return tanh(in * w); };
      const bool was = autograd::is_anomaly_enabled();
      autograd::set_detect_anomaly(anomaly);
      Tensor h = use_checkpoint ? checkpoint(inner, x) : inner(x);
      (h * w).sum().backward();
      autograd::set_detect_anomaly(was);
      grads[use_checkpoint] = w.grad();
    }
    CHECK(fired == 2);  // once per backward
    CHECK(bitwise_equal(grads[0], grads[1]));
  }
}
