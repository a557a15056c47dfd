// Optimizers and LR schedulers against torch.optim trajectories
// (tests/golden/make_optim_golden.py), state round trips, the no-gradient warning.
#include <map>

#include "harness.h"

using namespace nd;
using nd::testing::check_close;
using nd::testing::error_message;

namespace {

std::map<std::string, std::vector<double>> load_golden() {
  return nd::testing::read_golden_table(std::string(NANODDP_SOURCE_DIR) + "/tests/golden/optim_golden.txt");
}

Tensor grad_at(int t) { return tensor({0.1 * t, -0.2, 0.3 * (t % 2 ? -1 : 1)}, kFloat64); }

template <class MakeOpt>
std::vector<double> trajectory(MakeOpt make) {
  Tensor p = tensor({0.5, -1.0, 2.0}, kFloat64).requires_grad_();
  auto opt = make(std::vector<Tensor>{p});
  std::vector<double> out;
  for (int t = 1; t <= 4; ++t) {
    p.set_grad(grad_at(t));
    opt->step();
    for (double v : nd::testing::to_vector(p)) out.push_back(v);
  }
  return out;
}

void check_vec(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-12, what, "[", i, "]");
}

}  // namespace

TEST_CASE("optim: SGD, Adam and AdamW follow torch.optim step for step") {
  auto golden = load_golden();
  using optim::AdamOptions;
  using optim::AdamWOptions;
  using optim::SGDOptions;
  check_vec(trajectory([](auto ps) { return std::make_unique<optim::SGD>(ps, SGDOptions(0.1)); }), golden["sgd"],
            "sgd");
  check_vec(trajectory([](auto ps) {
              return std::make_unique<optim::SGD>(ps, SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
            }),
            golden["sgd_momentum_nesterov_wd"], "sgd nesterov");
  check_vec(trajectory([](auto ps) {
              return std::make_unique<optim::SGD>(ps, SGDOptions(0.05).momentum(0.5).dampening(0.3));
            }),
            golden["sgd_momentum_dampening"], "sgd dampening");
  check_vec(trajectory([](auto ps) { return std::make_unique<optim::Adam>(ps, AdamOptions(0.01).betas({0.5, 0.999})); }),
            golden["adam"], "adam");
  check_vec(trajectory([](auto ps) { return std::make_unique<optim::Adam>(ps, AdamOptions(0.01).weight_decay(0.1)); }),
            golden["adam_wd"], "adam weight decay");
  check_vec(trajectory([](auto ps) {
              auto o = AdamWOptions(0.01);
              o.amsgrad(true);
              return std::make_unique<optim::AdamW>(ps, o);
            }),
            golden["adamw_amsgrad"], "adamw amsgrad");
}

TEST_CASE("optim: one step over f32 and f64 parameters, some without a gradient, equals one optimizer each") {
  // A group's parameters are updated together, one multi-tensor step per device and dtype;
  // each keeps its own state: SGD's momentum buffer starts at its own first gradient,
  // Adam's bias corrections count its own steps (c skips step 1).
  using optim::AdamOptions;
  using optim::SGDOptions;
  auto make_params = [] {
    return std::vector<Tensor>{tensor({0.5, -1.0, 2.0}, kFloat64).requires_grad_(),
                               tensor({0.1, 0.2, -0.3, 0.4, 0.5}, kFloat32).requires_grad_(),
                               tensor({1.5, -0.5}, kFloat64).requires_grad_(),
                               tensor({-2.0, 0.25, 1.0, 3.0}, kFloat32).requires_grad_()};
  };
  auto grad_of = [](const Tensor& p, int t, size_t k) {
    return (full(p.sizes(), 0.1 * t - 0.05 * double(k), p.options()) + p.detach() * 0.3).detach();
  };
  auto check = [&](const std::string& what, auto make_opt) {
    INFO(what);
    std::vector<Tensor> together = make_params(), alone = make_params();
    auto opt = make_opt(together);
    std::vector<std::unique_ptr<optim::Optimizer>> each;
    for (const Tensor& p : alone) each.push_back(make_opt(std::vector<Tensor>{p}));
    for (int t = 1; t <= 3; ++t)
      for (size_t k = 0; k < together.size(); ++k) {
        const bool has_grad = !(k == 2 && t == 1);
        together[k].set_grad(has_grad ? grad_of(together[k], t, k) : Tensor());
        alone[k].set_grad(has_grad ? grad_of(alone[k], t, k) : Tensor());
        if (k + 1 == together.size()) {
          opt->step();
          for (size_t j = 0; j < alone.size(); ++j)
            if (alone[j].impl().grad) each[j]->step();
          for (size_t j = 0; j < alone.size(); ++j)
            CHECK_MESSAGE(nd::testing::to_vector(together[j]) == nd::testing::to_vector(alone[j]), "parameter ", j,
                          " after step ", t);
        }
      }
    CHECK(nd::testing::to_vector(together[2]) != nd::testing::to_vector(make_params()[2]));
  };
  check("sgd momentum", [](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(ps, SGDOptions(0.1).momentum(0.9).dampening(0.2).weight_decay(0.01));
  });
  check("adam amsgrad", [](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::Adam>(ps, AdamOptions(0.01).amsgrad(true).weight_decay(0.1));
  });
}

TEST_CASE("optim: schedulers follow torch.optim.lr_scheduler") {
  auto golden = load_golden();
  auto run = [](auto make_sched) {
    Tensor p = ones({1}).requires_grad_();
    optim::SGD opt({p}, optim::SGDOptions(0.1));
    auto sched = make_sched(opt);
    std::vector<double> lrs{opt.param_groups()[0].options().get_lr()};
    for (int i = 0; i < 8; ++i) {
      sched->step();
      lrs.push_back(sched->get_last_lr()[0]);
    }
    return lrs;
  };
  check_vec(run([](optim::Optimizer& o) { return std::make_unique<optim::StepLR>(o, 3, 0.5); }), golden["lr_steplr"],
            "StepLR");
  check_vec(run([](optim::Optimizer& o) { return std::make_unique<optim::CosineAnnealingLR>(o, 6, 0.01); }),
            golden["lr_cosine"], "CosineAnnealingLR");
  check_vec(run([](optim::Optimizer& o) {
              auto warm = std::make_shared<optim::LinearLR>(o, 0.25, 1.0, 3);
              auto cos = std::make_shared<optim::CosineAnnealingLR>(o, 5);
              return std::make_unique<optim::SequentialLR>(o, std::vector<std::shared_ptr<optim::LRScheduler>>{warm, cos},
                                                           std::vector<int64_t>{3});
            }),
            golden["lr_warmup_cosine"], "LinearLR warmup then cosine");
}

TEST_CASE("optim: param groups, zero_grad, version bumps named after the optimizer") {
  Tensor a = ones({2}).requires_grad_(), b = ones({2}).requires_grad_();
  optim::SGD opt({optim::OptimizerParamGroup({a}), optim::OptimizerParamGroup({b}, optim::SGDOptions(1.0))},
                 optim::SGDOptions(0.1));
  a.set_grad(ones({2}));
  b.set_grad(ones({2}));
  opt.step();
  check_close(a, {0.9, 0.9}, 1e-7, 0, "group 0 uses the default lr");
  check_close(b, {0, 0}, 1e-7, 0, "group 1 uses its own lr");
  CHECK(a._version() == 1);
  CHECK(a.storage()->last_modified_by() == "SGD.step");
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK(error_message([&] { optim::SGD bad({a, a}, optim::SGDOptions(0.1)); }).find("more than one parameter group") !=
        std::string::npos);
  CHECK(error_message([&] { optim::Adam bad({a}, optim::AdamOptions(0.1).betas({1.0, 0.9})); }).find("invalid beta1") !=
        std::string::npos);
}

TEST_CASE("optim: a step with no gradients warns once, naming the optimizer and its size (story 3)") {
  Tensor w = ones({3}).requires_grad_(), v = ones({2}).requires_grad_();
  optim::Adam opt({w, v}, optim::AdamOptions(0.1));
  nd::testing::WarningCapture warnings;
  opt.step();
  opt.step();
  REQUIRE(warnings.messages.size() == 1);
  CHECK(warnings.messages[0].find("Adam.step(): none of its 2 parameters has a gradient") != std::string::npos);
  check_close(w, {1, 1, 1}, 0, 0, "nothing moved");
}

TEST_CASE("optim: state_dict round trip resumes exactly") {
  auto make = [](Tensor p) { return std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, optim::AdamWOptions(0.01)); };
  Tensor p1 = tensor({0.5, -1.0, 2.0}, kFloat64).requires_grad_();
  auto o1 = make(p1);
  for (int t = 1; t <= 4; ++t) {
    p1.set_grad(grad_at(t));
    o1->step();
  }
  Tensor p2 = tensor({0.5, -1.0, 2.0}, kFloat64).requires_grad_();
  auto o2 = make(p2);
  for (int t = 1; t <= 2; ++t) {
    p2.set_grad(grad_at(t));
    o2->step();
  }
  TensorDict state = o2->state_dict();
  CHECK(state.count("state.0.exp_avg"));
  CHECK(state.at("state.0.step").item() == 2);
  Tensor p3 = p2.detach().clone().requires_grad_();
  auto o3 = make(p3);
  o3->load_state_dict(state);
  for (int t = 3; t <= 4; ++t) {
    p3.set_grad(grad_at(t));
    o3->step();
  }
  CHECK(nd::testing::to_vector(p3) == nd::testing::to_vector(p1));
  TensorDict bad = state;
  bad["state.0.exp_avg"] = zeros({5}, kFloat64);
  CHECK(error_message([&] { o3->load_state_dict(bad); }).find("has shape [5]") != std::string::npos);
}
