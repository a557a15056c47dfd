#pragma once
// The papers' training recipes as building blocks, so a program trains these models the
// way their authors did without re-deriving the settings.
//
// MAE pretraining (facebookresearch/mae main_pretrain.py, paper appendix A.1):
//   - AdamW, betas (0.9, 0.95): mae_adamw_options(lr);
//   - weight decay 0.05 on two param groups built like main_pretrain.py's
//     timm.optim.optim_factory.add_weight_decay: every 1-D parameter (LayerNorm weights
//     and biases, Linear and Conv2d biases) and every name ending in ".bias" gets none, all
//     others get weight_decay: mae_param_groups(model, lr, 0.05). MaskedAutoencoderViT has no
//     no_weight_decay(), so cls_token and mask_token ([1, 1, E], not 1-D) ARE decayed, as
//     in the reference's pretraining (the fine-tuning script exempts them; pretraining does
//     not). The fixed position embeddings are buffers here (frozen parameters there) and
//     are in neither group;
//   - lr = blr x effective batch / 256 with blr 1.5e-4: mae_lr(effective_batch);
//   - per-iteration schedule (util/lr_sched.py): linear warmup from 0, then half a cosine
//     to min_lr: MAEWarmupCosineLR(optimizer, warmup, total);
//   - norm_pix_loss: MAEConfig::norm_pix_loss (true in every config).
// DCGAN (Radford et al., PyTorch examples/dcgan): Adam, lr 2e-4, betas (0.5, 0.999):
// dcgan_adam_options().
// Tests: tests/models/recipes_test.cpp.
#include <cstdint>
#include <vector>

#include "engine/nn/module.h"
#include "engine/optim/adam.h"
#include "engine/optim/lr_scheduler.h"

namespace nd::models {

// {no-decay group, decay group} (add_weight_decay's order), each in named_parameters()
// order, each with mae_adamw_options(lr) and its weight decay (0, and weight_decay); a
// parameter that does not require grad is left out. optim::AdamW(mae_param_groups(m, lr),
// mae_adamw_options(lr)) is main_pretrain.py's optimizer.
std::vector<optim::OptimizerParamGroup> mae_param_groups(const nn::Module& model, double lr,
                                                         double weight_decay = 0.05);

// AdamW with the paper's betas (0.9, 0.95) at `lr`, weight_decay 0.05 (on every
// parameter when used without mae_param_groups, as train_mae does by default).
optim::AdamWOptions mae_adamw_options(double lr);

// blr x effective_batch / 256 (main_pretrain.py: effective batch = batch per GPU x
// accum_iter x world size). requires: effective_batch > 0, blr > 0.
double mae_lr(int64_t effective_batch, double blr = 1.5e-4);

// lr(step) = base step / warmup for step < warmup, then
// min_lr + (base - min_lr) (1 + cos(pi (step - warmup) / (total - warmup))) / 2
// (util/lr_sched.py's adjust_learning_rate, counted in steps). requires: 0 <= warmup <
// total, min_lr >= 0. The first step runs at lr 0 when warmup > 0, as the reference's.
class MAEWarmupCosineLR : public optim::LRScheduler {
 public:
  MAEWarmupCosineLR(optim::Optimizer& optimizer, int64_t warmup, int64_t total, double min_lr = 0);
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
};

// Adam, lr 2e-4, betas (0.5, 0.999): the DCGAN paper's and examples/dcgan's.
optim::AdamOptions dcgan_adam_options();

}  // namespace nd::models
