// CUDA graphs over a mixed-precision step (kernels/cuda/graph.h, engine/optim/grad_scaler.h):
// forward under autocast (bf16 or f16), the loss scaled by a GradScaler, backward, the
// scaler's unscale, its skip of a non-finite step and its scale update, all decided on the
// device, captured after two eager warm-up steps and replayed 5 times on static tensors, equal
// the same steps run eagerly bit for bit: every loss, parameter, gradient, Adam's state, the
// scale and whether the step was skipped, including an iteration whose input holds an inf (its
// gradients are not finite: the step is skipped and the scale backed off, as eagerly). Without
// a GPU every case reports "SKIPPED:"; under the emulator (tests/emu) it runs in CI.
#include <limits>
#include <string>
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

namespace {

nn::Sequential build() {
  manual_seed(7);
  nn::Sequential m(nn::Linear(nn::LinearOptions(8, 32)), nn::Tanh(), nn::Linear(nn::LinearOptions(32, 8)));
  m->to(kGpu);
  return m;
}

// Batch i on the CPU, from its own seed; batch kNonFiniteIteration's input holds an inf.
Tensor input(int i) {
  Generator g{uint64_t(300 + i), 0};
  Tensor x = randn({5, 8}, kFloat32, &g);
  if (i == kNonFiniteIteration) x.narrow(0, 2, 1).narrow(1, 3, 1).fill_(std::numeric_limits<double>::infinity());
  return x;
}

Tensor target(int i) {
  Generator g{uint64_t(400 + i), 0};
  return randn({5, 8}, kFloat32, &g);
}

struct Trainer {
  nn::Sequential net = build();
  optim::Adam opt{net->parameters(), optim::AdamOptions(1e-2).weight_decay(1e-3)};
  optim::GradScaler scaler{optim::GradScalerOptions().init_scale(1024.0).growth_interval(2)};
  ScalarType dtype;
  explicit Trainer(ScalarType autocast_dtype) : dtype(autocast_dtype) {}
  Tensor step(const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(kCUDA, true, dtype);
      loss = mse_loss(net->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    return loss;
  }
};

void check_amp_replays(ScalarType dtype) {
  constexpr int kSteps = 7, kWarmup = 2;
  Trainer eager(dtype), graphed(dtype);
  std::vector<testing::ScaledIteration> eager_after;
  for (int i = 0; i < kSteps; ++i) eager_after.push_back(iteration_of(eager.step(input(i).to(kGpu), target(i).to(kGpu)), eager.scaler));
  CHECK(eager_after[kNonFiniteIteration].skipped);  // the case is what it claims
  CHECK(eager_after[kNonFiniteIteration].scale == eager_after[kNonFiniteIteration - 1].scale / 2);
  CHECK(eager_after[kNonFiniteIteration - 1].scale == 4096.0);  // and growth before it: 1024 doubled twice

  Tensor x = empty({5, 8}, TensorOptions().device(kGpu)), y = empty({5, 8}, TensorOptions().device(kGpu));
  for (int i = 0; i < kWarmup; ++i) {
    x.copy_(input(i));
    y.copy_(target(i));
    check_same_iteration(iteration_of(graphed.step(x, y), graphed.scaler), eager_after[i]);
  }
  cuda::Graph graph(0);
  graph.capture_begin();
  const Tensor loss = graphed.step(x, y);
  graph.capture_end();
  for (int i = kWarmup; i < kSteps; ++i) {
    CAPTURE(i);
    x.copy_(input(i));
    y.copy_(target(i));
    graph.replay();
    check_same_iteration(iteration_of(loss, graphed.scaler), eager_after[i]);
  }
  CHECK(graphed.scaler.growth_tracker() == eager.scaler.growth_tracker());
  const auto pe = eager.net->named_parameters(), pg = graphed.net->named_parameters();
  REQUIRE(pe.size() == pg.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    CAPTURE(pe[i].first);
    CHECK(testing::bitwise_equal(pg[i].second.cpu(), pe[i].second.cpu()));
    CHECK(testing::bitwise_equal(pg[i].second.grad().cpu(), pe[i].second.grad().cpu()));
  }
  const TensorDict se = eager.opt.state_dict(), sg = graphed.opt.state_dict();
  REQUIRE(se.size() == sg.size());
  for (const auto& [key, value] : se) {
    CAPTURE(key);
    REQUIRE(sg.count(key));
    CHECK(testing::bitwise_equal(sg.at(key).cpu(), value.cpu()));
  }
  CHECK(testing::to_vector(sg.at("state.0.step")) == std::vector<double>{double(kSteps - 1)});  // one skipped
  const TensorDict ke = eager.scaler.state_dict(), kg = graphed.scaler.state_dict();
  for (const auto& [key, value] : ke) {
    CAPTURE(key);
    CHECK(testing::bitwise_equal(kg.at(key), value));
  }
  // An eager step after the replays goes on from the device's scale.
  const testing::ScaledIteration after_eager = iteration_of(eager.step(input(0).to(kGpu), target(0).to(kGpu)), eager.scaler);
  x.copy_(input(0));
  y.copy_(target(0));
  check_same_iteration(iteration_of(graphed.step(x, y), graphed.scaler), after_eager);
}

}  // namespace

TEST_CASE("cuda graphs: an autocast + GradScaler + Adam step replayed 5 times equals eager bit for bit, a skipped non-finite step included") {
  if (skip_without_gpu()) return;
  SUBCASE("bf16") { check_amp_replays(kBFloat16); }
  SUBCASE("f16") { check_amp_replays(kFloat16); }
}

TEST_CASE("cuda graphs: a GradScaler without an eager step on the device is refused by name in a capture") {
  if (skip_without_gpu()) return;
  optim::GradScaler scaler;
  const Tensor loss = full({}, 2.0, TensorOptions().device(kGpu));
  cuda::Graph graph(0);
  graph.capture_begin();
  CHECK_THROWS_WITH_AS(scaler.scale(loss),
                       "GradScaler.scale: the scale is not on cuda:0 yet, so a CUDA graph cannot capture it (take an "
                       "eager warm-up step with this scaler on that device before the capture)",
                       Error);
}

TEST_CASE("cuda graphs: GradScaler's refusals in a capture are by name") {
  if (skip_without_gpu()) return;
  auto net = build();
  optim::SGD sgd(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::GradScaler scaler;
  const Tensor x = input(0).to(kGpu), y = target(0).to(kGpu);
  // An eager unscale_ without a step: the scale now lives on cuda:0, the gradients exist (the
  // capture's backward accumulates into them) and the unscale's chunk table is uploaded, but SGD
  // has no momentum buffer yet.
  scaler.scale(mse_loss(net->forward(x), y)).backward();
  scaler.unscale_(sgd);
  scaler.update();
  cuda::Graph graph(0);
  graph.capture_begin();
  scaler.scale(mse_loss(net->forward(x), y)).backward();
  CHECK_THROWS_WITH_AS(scaler.step(sgd),
                       ("SGD.step_unless: parameter " + net->parameters()[0].describe() +
                        " has no momentum buffer yet (take a first step without the flag)")
                           .c_str(),
                       Error);
}

// ---- GraphedStep (engine/optim/graphed_step.h): the capture-once helper and what it refuses ----

namespace {

struct Graphed {
  nn::Sequential net = build();
  optim::Adam opt{net->parameters(), optim::AdamOptions(1e-2)};
  cuda::GraphedStep step{[this](const std::vector<Tensor>& in) {
                           opt.zero_grad();
                           Tensor loss = mse_loss(net->forward(in[0]), in[1]);
                           loss.backward();
                           opt.step();
                           return std::vector<Tensor>{loss};
                         },
                         {&opt}};
};

}  // namespace

TEST_CASE("cuda graphs: GraphedStep runs 2 warm-up calls, captures the third, replays the rest, equal to eager") {
  if (skip_without_gpu()) return;
  Graphed g;
  auto net = build();
  optim::Adam opt(net->parameters(), optim::AdamOptions(1e-2));
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    opt.zero_grad();
    const Tensor want = mse_loss(net->forward(input(i + 10).to(kGpu)), target(i).to(kGpu));
    want.backward();
    opt.step();
    const std::vector<Tensor> got = g.step({input(i + 10).to(kGpu), target(i).to(kGpu)});
    CHECK(g.step.captured() == (i >= 2));
    REQUIRE(got.size() == 1);
    CHECK(testing::bitwise_equal(got[0].cpu(), want.cpu()));
  }
  CHECK(g.step.num_nodes() > 0);
  CHECK(testing::bitwise_equal(g.net->parameters()[2].cpu(), net->parameters()[2].cpu()));
}

TEST_CASE("cuda graphs: GraphedStep refuses a changed input, parameter set, hyperparameter or loaded state by name, before it runs") {
  if (skip_without_gpu()) return;
  Graphed g;
  const Tensor x = input(0).to(kGpu), y = target(0).to(kGpu);
  CHECK_THROWS_WITH_AS(g.step({input(0), y}),
                       ("GraphedStep: expected every input on one CUDA device, found input 0 " + input(0).describe()).c_str(),
                       Error);
  for (int i = 0; i < 3; ++i) (void)g.step({x, y});
  REQUIRE(g.step.captured());
  const std::vector<double> before = testing::to_vector(g.net->parameters()[2].cpu());
  for (const auto& [changed, layout] : std::vector<std::pair<Tensor, std::string>>{
           {empty({5, 9}, TensorOptions().device(kGpu)), "[5, 9] f32 on cuda:0"}, {x.to(kFloat64), "[5, 8] f64 on cuda:0"}})
    CHECK(testing::error_message([&] { (void)g.step({changed, y}); }) ==
          "GraphedStep: input 0 " + changed.describe() + " is " + layout +
              ", but the step was captured for [5, 8] f32 on cuda:0 (a replay reads the captured shapes: make a new "
              "GraphedStep for another shape)");
  CHECK_THROWS_WITH_AS(g.step({x}), "GraphedStep: the step was captured with 2 input(s), found 1", Error);
  g.opt.param_groups()[0].options().set_lr(5e-3);
  CHECK_THROWS_WITH_AS(g.step({x, y}),
                       "GraphedStep: Adam's parameter group 0 has lr 0.005, but the step was captured with 0.01 (the "
                       "captured launches hold it by value: make a new GraphedStep after changing it)",
                       Error);
  g.opt.param_groups()[0].options().set_lr(1e-2);
  Tensor extra = zeros({3}, TensorOptions().device(kGpu)).requires_grad_(true);
  g.opt.add_param_group(optim::OptimizerParamGroup({extra}));
  CHECK_THROWS_WITH_AS(g.step({x, y}),
                       "GraphedStep: Adam holds 5 parameter(s), but the step was captured with 4 (a replay updates the "
                       "captured parameters only: make a new GraphedStep)",
                       Error);
  g.opt.param_groups().pop_back();
  const Tensor w = g.opt.param_groups()[0].params()[0];
  const Tensor moved = zeros(w.sizes(), w.options()).requires_grad_(true);
  g.opt.param_groups()[0].params()[0] = moved;
  const std::string moved_msg = testing::error_message([&] { (void)g.step({x, y}); });
  CHECK(moved_msg.starts_with("GraphedStep: Adam's parameter 0 is " + moved.describe() + " at "));
  CHECK(moved_msg.ends_with(" (a replay updates the captured parameters' memory only: make a new GraphedStep)"));
  g.opt.param_groups()[0].params()[0] = w;
  g.net->parameters()[1].requires_grad_(false);
  CHECK_THROWS_WITH_AS(g.step({x, y}),
                       ("GraphedStep: Adam's parameter 1 " + g.net->parameters()[1].describe() +
                        " does not require grad, but did at the capture (a replay computes and applies the captured "
                        "gradients only: make a new GraphedStep)")
                           .c_str(),
                       Error);
  g.net->parameters()[1].requires_grad_(true);
  CHECK(testing::to_vector(g.net->parameters()[2].cpu()) == before);  // nothing ran
  (void)g.step({x, y});  // as captured again: replays
  const std::vector<double> replayed = testing::to_vector(g.net->parameters()[2].cpu());
  CHECK(replayed != before);
  g.opt.load_state_dict(g.opt.state_dict());
  CHECK_THROWS_WITH_AS(g.step({x, y}),
                       "GraphedStep: Adam loaded a state after the capture (load_state_dict makes new state tensors, "
                       "which a replay would not see: make a new GraphedStep after loading)",
                       Error);
  CHECK(testing::to_vector(g.net->parameters()[2].cpu()) == replayed);
  CHECK_THROWS_WITH_AS(cuda::GraphedStep([](const std::vector<Tensor>&) { return std::vector<Tensor>{}; }, {}, 0),
                       "GraphedStep: expected warmup >= 1 (the warm-up calls create the optimizers' state, which the "
                       "capture reads), found 0",
                       Error);
}
