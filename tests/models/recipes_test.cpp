// The papers' recipes (models/recipes.h): MAE param groups against timm's add_weight_decay
// run on the reference MaskedAutoencoderViT (counts and names printed by
// tests/golden/reference_models.py's MAE through that rule), what AdamW does with them,
// the lr scaling, the warmup-cosine schedule (util/lr_sched.py's values by hand) and
// DCGAN's Adam options.
#include <cmath>
#include <set>

#include "harness.h"

using namespace nd;
using nd::testing::error_message;

TEST_CASE("recipes: MAE param groups exempt 1-D parameters and biases only, tokens are decayed (add_weight_decay)") {
  models::MAE mae(models::MAEConfig::tiny());
  const auto groups = models::mae_param_groups(*mae, 1e-3, 0.05);
  REQUIRE(groups.size() == 2);
  auto numel = [](const std::vector<Tensor>& ps) {
    int64_t n = 0;
    for (const Tensor& p : ps) n += p.numel();
    return n;
  };
  // timm's add_weight_decay on models_mae.py's class at the tiny config: 31 tensors
  // (2,384 values) without decay, 17 (114,272) with it.
  CHECK(groups[0].params().size() == 31);
  CHECK(numel(groups[0].params()) == 2384);
  CHECK(groups[1].params().size() == 17);
  CHECK(numel(groups[1].params()) == 114272);
  const std::set<std::string> reference_decayed = {
      "cls_token", "mask_token", "patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
      "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight", "blocks.1.attn.qkv.weight", "blocks.1.attn.proj.weight",
      "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.weight", "decoder_embed.weight",
      "decoder_blocks.0.attn.qkv.weight", "decoder_blocks.0.attn.proj.weight", "decoder_blocks.0.mlp.fc1.weight",
      "decoder_blocks.0.mlp.fc2.weight", "decoder_pred.weight"};
  std::set<std::string> decayed;
  for (const auto& [name, p] : mae->named_parameters())
    for (const Tensor& q : groups[1].params())
      if (q.impl_ptr() == p.impl_ptr()) decayed.insert(name);
  CHECK(decayed == reference_decayed);
  const auto& o0 = dynamic_cast<const optim::AdamWOptions&>(groups[0].options());
  const auto& o1 = dynamic_cast<const optim::AdamWOptions&>(groups[1].options());
  CHECK(o0.weight_decay_ == 0);
  CHECK(o1.weight_decay_ == 0.05);
  CHECK(o1.lr_ == 1e-3);
  CHECK(o1.betas_ == std::pair<double, double>{0.9, 0.95});

  // A step with zero gradients is the decoupled decay alone: p (1 - lr wd) for the decay
  // group, unchanged for the other.
  std::vector<Tensor> before;
  for (const Tensor& p : mae->parameters()) {
    p.set_grad(zeros_like(p));
    before.push_back(p.detach().clone());
  }
  optim::AdamW opt(models::mae_param_groups(*mae, 0.5, 0.05), models::mae_adamw_options(0.5));
  opt.step();
  size_t i = 0;
  for (const auto& [name, p] : mae->named_parameters()) {
    CAPTURE(name);
    const double factor = reference_decayed.count(name) ? 1 - 0.5 * 0.05 : 1.0;
    nd::testing::check_close(p, before[i++] * factor, 1e-7, 1e-6, name);
  }
}

TEST_CASE("recipes: lr = blr x batch / 256, the warmup-cosine schedule, DCGAN's Adam") {
  CHECK(models::mae_lr(4096) == doctest::Approx(2.4e-3).epsilon(1e-12));  // the paper's ViT-L run
  CHECK(models::mae_lr(256, 1e-3) == 1e-3);
  CHECK(error_message([] { models::mae_lr(0); }) ==
        "mae_lr: expected a positive effective batch and blr, found 0 and 0.00015");

  Tensor w = zeros({2}).requires_grad_();
  optim::AdamW opt({w}, models::mae_adamw_options(1.0));
  models::MAEWarmupCosineLR schedule(opt, 2, 6, 0.1);
  // util/lr_sched.py: step / warmup, then min + (1 - min) (1 + cos(pi (step - 2) / 4)) / 2.
  const double c = 0.5 * (1 + std::cos(M_PI / 4));
  const std::vector<double> expected = {0, 0.5, 1, 0.1 + 0.9 * c, 0.55, 0.1 + 0.9 * (1 - c), 0.1, 0.1};
  for (size_t step = 0; step < expected.size(); ++step) {
    CAPTURE(step);
    CHECK(schedule.get_last_lr()[0] == doctest::Approx(expected[step]).epsilon(1e-12));
    schedule.step();
  }
  CHECK(error_message([&] { models::MAEWarmupCosineLR(opt, 6, 6); }) ==
        "MAEWarmupCosineLR: expected 0 <= warmup < total, found warmup 6, total 6");

  const optim::AdamOptions adam = models::dcgan_adam_options();
  CHECK(adam.lr_ == 2e-4);
  CHECK(adam.betas_ == std::pair<double, double>{0.5, 0.999});
  CHECK(adam.weight_decay_ == 0);
}
