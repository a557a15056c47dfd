// train_mae: the masked autoencoder of models/mae.h (tiny on the CPU, small on CUDA, at
// the image size and channels of --data: Fashion-MNIST, an image folder or CIFAR) with
// AdamW (betas 0.9, 0.95, weight decay 0.05) and a linear warmup then cosine schedule
// (--paper-recipe: facebookresearch/mae's, models/recipes.h),
// under DistributedDataParallel with default options. Writes DIR/samples_<step>.png
// (rows of original / masked / reconstruction triplets of test images), the
// masked-patch test loss, metrics.jsonl, loss_curve.png and ckpt/.
// --probe (Fashion-MNIST): a linear probe (logistic regression trained with Adam on
// standardised, frozen, mean-pooled encoder features) reports the test accuracy.
#include <algorithm>
#include <memory>
#include <random>
#include <string>

#include "common/flags.h"
#include "common/model_select.h"
#include "common/png.h"
#include "common/run.h"

namespace {

using nd::Tensor;
namespace models = nd::models;

struct Options : app::CommonOptions, app::DataOptions {
  std::string model;  // "": the config for the data's image size (tiny on cpu, small on cuda; 224: the ViT-B)
  bool checkpoint_activations = false;
  std::string init_from;  // an MAE's (or its encoder's) weights to start from
  int64_t warmup = 0;  // 0: 5% of --steps
  bool paper_recipe = false;
  double blr = 1.5e-4;  // --paper-recipe's base lr, unless --lr
  bool probe = false;
  int64_t probe_train = 60000;
};

// Per-sample masking noise for n images, drawn from a fixed generator (the same
// masks at every evaluation).
Tensor fixed_noise(int64_t n, int64_t patches) {
  nd::Generator gen{4242, 0};
  return nd::rand({n, patches}, {}, &gen);
}

// [n, C, S, S] originals -> 3n images: original, masked (gray patches), reconstruction
// (predicted masked patches de-normalised with each patch's own mean and std, visible
// patches pasted from the original), per sample.
Tensor triplets(models::MAE& mae, const Tensor& images) {
  nd::NoGradGuard no_grad;
  const int64_t p = mae->config.patch_size, c = mae->config.in_chans, n = images.size(0);
  const models::MAEOutput out = mae->forward(images, fixed_noise(n, mae->config.num_patches()));
  const Tensor target = models::patchify(images, p);
  const Tensor mask = out.mask.unsqueeze(-1), keep = 1.0 - mask;
  Tensor pred = out.pred;
  if (mae->config.norm_pix_loss)
    pred = pred * (target.var({2}, 1, true) + 1e-6).sqrt() + target.mean({2}, true);
  const Tensor masked = models::unpatchify(target * keep, p, c);
  const Tensor recon = models::unpatchify(pred * mask + target * keep, p, c);
  return nd::stack({images, masked, recon}, 1).reshape({3 * n, c, images.size(2), images.size(3)});
}

// Masked-patch loss on `images` with the fixed masks, eval mode.
double test_loss(models::MAE& mae, const Tensor& images, nd::Device device) {
  const Tensor noise = fixed_noise(images.size(0), mae->config.num_patches());
  double sum = 0;
  int64_t chunks = 0;
  nd::NoGradGuard no_grad;
  for (int64_t start = 0; start < images.size(0); start += 500, ++chunks) {
    const int64_t len = std::min<int64_t>(500, images.size(0) - start);
    sum += mae->forward(images.narrow(0, start, len).to(device), noise.narrow(0, start, len)).loss.item();
  }
  return sum / static_cast<double>(chunks);
}

// Logistic regression on frozen features: standardise with the training statistics,
// then Adam (lr 1e-2) on cross-entropy, batches of 256, 30 epochs. Returns test accuracy.
double linear_probe(models::MAE& mae, const nd::data::Dataset& train, const nd::data::Dataset& test, int64_t n_train,
                    nd::Device device, app::Logger& log) {
  auto features = [&](const Tensor& x) { return mae->features(x); };
  Tensor f_train = app::map_chunks(train.images.narrow(0, 0, n_train), 1000, device, features);
  Tensor f_test = app::map_chunks(test.images, 1000, device, features);
  const Tensor mean = f_train.mean({0}, true), std = (f_train.var({0}, 1, true) + 1e-6).sqrt();
  f_train = (f_train - mean) / std;
  f_test = (f_test - mean) / std;
  const Tensor y_train = train.labels.narrow(0, 0, n_train);
  nd::manual_seed(7);
  nd::nn::Linear probe(nd::nn::LinearOptions(f_train.size(1), 10));
  nd::optim::Adam opt(probe->parameters(), nd::optim::AdamOptions(1e-2));
  std::mt19937_64 rng(8);
  Tensor order = nd::arange(static_cast<double>(n_train), nd::TensorOptions(nd::kInt64));
  for (int epoch = 0; epoch < 30; ++epoch) {
    std::shuffle(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + n_train, rng);
    for (int64_t start = 0; start + 256 <= n_train; start += 256) {
      const Tensor idx = order.narrow(0, start, 256);
      opt.zero_grad();
      nd::cross_entropy(probe(f_train.index_select(0, idx)), y_train.index_select(0, idx)).backward();
      opt.step();
    }
  }
  nd::NoGradGuard no_grad;
  const double accuracy = probe(f_test).argmax(1).eq(test.labels).to(nd::kFloat64).mean().item();
  log.say("linear probe: " + std::to_string(n_train) + " training images, " +
          std::to_string(f_train.size(1)) + " features");
  return accuracy;
}

// The optimizer's lr and parameter groups (none: one group, weight decay 0.05 on all) and
// where the lr comes from.
struct Recipe {
  double lr;
  std::vector<nd::optim::OptimizerParamGroup> groups;
  std::string lr_from;
};

// facebookresearch/mae's main_pretrain.py (models/recipes.h): lr = blr x global batch / 256
// unless --lr gives it, AdamW (0.9, 0.95), weight decay 0.05 but none on 1-D parameters
// and biases.
Recipe paper_recipe(const Options& o, const nd::nn::Module& model) {
  const bool absolute = o.flags && o.flags->given("--lr");
  const double lr = absolute ? o.lr : models::mae_lr(o.batch_size, o.blr);
  return {lr, models::mae_param_groups(model, lr, 0.05),
          absolute ? "--lr"
                   : "blr " + app::format_double(o.blr) + " x global batch " + std::to_string(o.batch_size) + " / 256"};
}

// The recipe as the optimizer holds it: the lr after warmup, betas and each group's weight
// decay and size.
std::string describe(const Recipe& recipe, const nd::optim::Optimizer& optimizer) {
  const auto first = optimizer.param_groups()[0].options().to_map();
  std::string text = "train_mae: the paper's recipe: AdamW lr " + app::format_double(recipe.lr) + " (" +
                     recipe.lr_from + "), betas (" + app::format_double(first.at("beta1")) + ", " +
                     app::format_double(first.at("beta2")) + "), weight decay";
  for (const auto& group : optimizer.param_groups())
    text += (&group == &optimizer.param_groups()[0] ? " " : " and ") +
            app::format_double(group.options().to_map().at("weight_decay")) + " on " +
            std::to_string(group.params().size()) + " tensors";
  return text + " (none on 1-D parameters and biases)";
}

int train(Options& o) {
  app::Run run("train_mae", o);
  const nd::Device device = run.device;
  if (o.flags && o.flags->given("--blr") && !o.paper_recipe)
    throw app::UsageError{"--blr needs --paper-recipe (without it, --lr is the learning rate)"};
  if (o.flags && o.flags->given("--blr") && o.flags->given("--lr"))
    throw app::UsageError{"--lr and --blr cannot be combined: --lr is the learning rate, --blr the base one "
                          "(lr = blr x global batch / 256)"};
  if (o.probe && o.probe_train > 60000) throw app::UsageError{"--probe-train is at most 60000"};
  const app::TrainData train_set = app::load_train_data(o.data, o, run.world);
  if (o.probe && !train_set.is_idx())
    throw app::UsageError{"--probe: the linear probe uses Fashion-MNIST's labelled test set; --data " + o.data +
                          " holds " + train_set.kind + " images"};
  // The data decides the image size and channels (common/model_select.h).
  models::MAEConfig config = app::mae_config(o.model, train_set.shape(), device);
  if (o.model.empty())
    o.model = config.img_size == 224 ? "mae_vit_base_patch16_dec512d8b" : device.is_cpu() ? "tiny" : "small";
  config.checkpoint_activations = o.checkpoint_activations;

  nd::manual_seed(static_cast<uint64_t>(o.seed));
  models::MAE M(config);
  const std::string init = o.init_from.empty() ? "" : app::init_mae_from(*M, o.init_from);
  M->to(device);
  const Recipe recipe = o.paper_recipe ? paper_recipe(o, *M) : Recipe{o.lr, {}, "--lr"};
  auto m = run.wrap<nd::optim::AdamW>("MAE", M, models::mae_adamw_options(recipe.lr), recipe.groups);
  const int64_t warmup = o.paper_recipe ? (o.warmup ? o.warmup : o.steps / 20)
                                        : std::max<int64_t>(1, o.warmup ? o.warmup : o.steps / 20);
  const std::unique_ptr<nd::optim::LRScheduler> schedule =
      o.paper_recipe ? std::make_unique<models::MAEWarmupCosineLR>(*m.optimizer, warmup, std::max(o.steps, warmup + 1))
                     : app::warmup_cosine(*m.optimizer, warmup, o.steps);
  run.state.schedulers.emplace_back("MAE", schedule.get());
  run.same_on_resume("--paper-recipe", o.paper_recipe ? "on" : "off", "off");
  const int64_t start = run.start(train_set, o);

  app::Logger& log = run.log();
  log.say("train_mae: " + std::to_string(run.world.size) + " rank(s), device " + device.str() + ", model " + o.model +
          ", " + train_set.describe() + ", global batch " + std::to_string(o.batch_size) + ", steps " +
          std::to_string(start + 1) + ".." + std::to_string(o.steps) + ", output " + o.out +
          (o.checkpoint_activations ? ", activation checkpointing" : ""));
  if (o.paper_recipe)
    log.say(describe(recipe, *m.optimizer) + "; warmup " + std::to_string(warmup) +
            " steps from lr 0, then a cosine to 0; norm_pix_loss " + (config.norm_pix_loss ? "on" : "off"));
  if (!init.empty()) log.say("train_mae: initialised the " + init);
  // Rank 0 samples and evaluates: the test set's first 1000 images (a folder: its own).
  const Tensor eval_images = run.world.rank0() ? app::eval_images(train_set, 1000) : Tensor();
  auto evaluate = [&](int64_t step) {
    if (!run.world.rank0()) return;
    nd::cpu::empty_cache();  // the training step's cached blocks would only add to this pass's peak
    const Tensor grid = triplets(M, eval_images.narrow(0, 0, std::min<int64_t>(16, eval_images.size(0))).to(device));
    run.save_samples(step, app::image_grid(grid, 6));
    log.record(step, {{"test_loss", test_loss(M, eval_images, device)}});
  };

  for (int64_t step = start + 1; step <= o.steps; ++step) {
    const Tensor images = run.batches().next().images;
    // Masking noise for the whole global batch, then this rank's rows; on the host, where
    // the MAE computes the masking.
    const Tensor noise = app::shard_rows(nd::rand({o.batch_size, config.num_patches()}), run.world);
    m.optimizer->zero_grad();
    const Tensor loss = m(images, noise).loss;
    const double lr = m.optimizer->param_groups()[0].options().get_lr();  // this step's
    const double norm = m.step(loss);
    run.scaler.update();
    schedule->step();
    log.step(step, {{"loss", loss.item()}}, {{"MAE", norm}}, {{"lr", lr}});
    if (step % o.sample_every == 0 || step == o.steps) evaluate(step);
    if (const auto status = run.end_of_step(step)) return *status;
  }
  if (start >= o.steps) evaluate(start);  // --steps 0: the checkpoint's model
  if (o.probe && run.world.rank0())
    log.record(std::max(start, o.steps),
               {{"probe_accuracy", linear_probe(M, train_set.tensors, nd::data::load_fashion_mnist(o.data, false),
                                                o.probe_train, device, log)}});
  log.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_main("train_mae", [&] {
    Options o;
    o.steps = 3500;  // the linear probe reaches 80.8% here (79.3% at 2000): bench/RESULTS.md
    o.batch_size = 128;
    o.lr = 1e-3;
    app::Flags flags("train_mae",
                     "Trains a masked autoencoder on Fashion-MNIST, an image folder or CIFAR; alone or under mpirun.\n"
                     "Writes samples_<step>.png (original / masked / reconstruction), metrics.jsonl,\n"
                     "loss_curve.png and ckpt/ to --out.");
    app::add_common_flags(flags, o, /*has_batch_norm=*/false);
    app::add_data_flags(flags, o);
    flags.add("--model", &o.model,
              "MAE configuration: tiny, small, mae_vit_base_patch16_dec512d8b, mae_vit_large_patch16_dec512d8b or "
              "mae_vit_huge_patch14_dec512d8b (default: tiny on cpu, small on cuda, at the data's image size; for "
              "224x224 images the ViT-B)",
              "NAME");
    flags.add("--checkpoint-activations", &o.checkpoint_activations,
              "recompute each transformer block's activations in backward instead of keeping them (less memory, "
              "about a third more compute; the same results)");
    flags.add("--init-from", &o.init_from,
              "start from an MAE's weights (safetensors; models/mae_pth_to_safetensors.py converts the paper's "
              ".pth): a whole MAE, or an encoder alone (the decoder keeps its init)",
              "FILE");
    flags.add("--warmup", &o.warmup, "linear warmup steps (0: 5% of --steps)", 0);
    flags.add("--paper-recipe", &o.paper_recipe,
              "facebookresearch/mae's pretraining recipe: AdamW betas (0.9, 0.95), weight decay 0.05 except on 1-D "
              "parameters and biases, lr = --blr x global batch / 256 (or --lr), warmup from 0 then cosine");
    flags.add("--blr", &o.blr, "--paper-recipe's base learning rate (lr = blr x global batch / 256)");
    flags.add("--probe", &o.probe, "at the end, a linear probe on frozen encoder features (test accuracy)");
    flags.add("--probe-train", &o.probe_train, "training images for the linear probe");
    flags.parse(argc, argv);
    return train(o);
  });
}
