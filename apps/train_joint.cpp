// train_joint: the job that motivated nanoddp (docs/traps.md): three models
// trained together under DistributedDataParallel with default options, each with its
// own optimizer, in one loop:
//   G (Perturber)   x -> x + 0.1 tanh(r(x)), a small conv net;         Adam (0.5, 0.999)
//   D (DCGAN disc.) original -> 1, perturbed -> 0, called on both each step,
//                   with SyncBatchNorm (convert_sync_batchnorm);          Adam (0.5, 0.999)
//   MAE             reconstructs the original from masked perturbed images;
//                   AdamW with linear warmup then cosine.
// Each step: D learns on (x, G(x).detach()); G learns to make D call G(x) original
// (non-saturating loss); the MAE learns on G(x).detach() with the original as target.
// The log shows every model's last update norm, so a frozen model is visible at once,
// and metrics.jsonl counts each model's parameters that did not change in a step.
#include <algorithm>
#include <string>

#include "common/flags.h"
#include "common/model_select.h"
#include "common/png.h"
#include "common/run.h"

namespace nd::apps {

// A residual perturbation of images with c channels: conv 3x3 (c -> w), ReLU, conv
// (w -> w), ReLU, conv (w -> c), out = x + 0.1 tanh(.). No BatchNorm, so N ranks equal one
// process without synchronising statistics.
class PerturberImpl : public nn::Module {
 public:
  explicit PerturberImpl(int64_t width = 16, int64_t channels = 1) {
    net = register_module(
        "net", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(channels, width, 3).padding(1)), nn::ReLU(),
                              nn::Conv2d(nn::Conv2dOptions(width, width, 3).padding(1)), nn::ReLU(),
                              nn::Conv2d(nn::Conv2dOptions(width, channels, 3).padding(1))));
  }
  Tensor forward(const Tensor& x) override { return x + net(x).tanh() * 0.1; }

  nn::Sequential net{nullptr};
};
ND_MODULE(Perturber);

}  // namespace nd::apps

namespace {

using nd::Tensor;
namespace models = nd::models;

struct Options : app::CommonOptions, app::DataOptions {
  std::string model;  // MAE: tiny (cpu) / small (cuda)
  int64_t gwidth = 16, ndf = 32;
  double lr_mae = 1e-3;
};

int train(Options& o) {
  app::Run run("train_joint", o);
  const nd::Device device = run.device;
  const app::TrainData train_set = app::load_train_data(o.data, o, run.world);
  // The data decides the image size and channels of the three models (common/model_select.h).
  const models::MAEConfig config = app::mae_config(o.model, train_set.shape(), device, /*allow_vit=*/false);
  if (o.model.empty()) o.model = device.is_cpu() ? "tiny" : "small";
  models::DCGANConfig d_config = app::dcgan_config("", train_set.shape());
  d_config.ndf = o.ndf;

  nd::manual_seed(static_cast<uint64_t>(o.seed));
  nd::apps::Perturber G(o.gwidth, train_set.channels);
  models::DCGANDiscriminator D(d_config);
  models::dcgan_init(*D);
  nd::nn::convert_sync_batchnorm(D.ptr());  // after dcgan_init, which sets the BatchNorm weights
  models::MAE M(config);
  G->to(device);
  D->to(device);
  M->to(device);
  auto g = run.wrap<nd::optim::Adam>("G", G, nd::optim::AdamOptions(o.lr).betas({0.5, 0.999}));
  auto d = run.wrap<nd::optim::Adam>("D", D, nd::optim::AdamOptions(o.lr).betas({0.5, 0.999}));
  nd::optim::AdamWOptions adamw(o.lr_mae);
  adamw.betas({0.9, 0.95}).weight_decay(0.05);
  auto m = run.wrap<nd::optim::AdamW>("MAE", M, adamw);
  const auto schedule = app::warmup_cosine(*m.optimizer, std::max<int64_t>(1, o.steps / 20), o.steps);
  run.state.schedulers.emplace_back("MAE", schedule.get());
  const int64_t start = run.start(train_set, o);

  app::Logger& log = run.log();
  log.watch("G", *G), log.watch("D", *D), log.watch("MAE", *M);
  log.say("train_joint: " + std::to_string(run.world.size) + " rank(s), device " + device.str() + ", MAE " + o.model +
          ", " + train_set.describe() + ", global batch " + std::to_string(o.batch_size) + ", steps " +
          std::to_string(start + 1) + ".." + std::to_string(o.steps) + ", output " + o.out);
  auto bce = [](const Tensor& logits, bool original) {
    return nd::binary_cross_entropy_with_logits(logits, original ? nd::ones_like(logits) : nd::zeros_like(logits));
  };
  // Rank 0 draws its samples from the test set's first 16 images (a folder: its own).
  const Tensor sample_images = run.world.rank0() ? app::eval_images(train_set, 16) : Tensor();
  auto write_samples = [&](int64_t step) {
    if (!run.world.rank0()) return;
    nd::NoGradGuard no_grad;
    const Tensor x = sample_images.to(device);
    const int64_t n = x.size(0), c = x.size(1);
    const Tensor perturbed = G->forward(x);
    nd::Generator gen{4242, 0};
    const Tensor noise = nd::rand({n, config.num_patches()}, {}, &gen);
    const models::MAEEncoderOutput enc = M->forward_encoder(perturbed, config.mask_ratio, noise);
    const Tensor pred = M->forward_decoder(enc.latent, enc.ids_restore);
    const Tensor target = models::patchify(x, config.patch_size);
    const Tensor mask = enc.mask.unsqueeze(-1);
    Tensor recon = pred;
    if (config.norm_pix_loss) recon = pred * (target.var({2}, 1, true) + 1e-6).sqrt() + target.mean({2}, true);
    recon = models::unpatchify(recon * mask + target * (1.0 - mask), config.patch_size, c);
    const Tensor masked = models::unpatchify(models::patchify(perturbed, config.patch_size) * (1.0 - mask),
                                             config.patch_size, c);
    // Per sample: original, perturbed, masked perturbed, reconstruction.
    const Tensor grid = nd::stack({x, perturbed, masked, recon}, 1).reshape({4 * n, c, x.size(2), x.size(3)});
    run.save_samples(step, app::image_grid(grid, 8));
  };

  for (int64_t step = start + 1; step <= o.steps; ++step) {
    const Tensor x = run.batches().next().images;
    // Masking noise for the whole global batch, then this rank's rows; on the host, where
    // the MAE computes the masking.
    const Tensor noise = app::shard_rows(nd::rand({o.batch_size, config.num_patches()}), run.world);
    const Tensor perturbed = g(x);

    d.optimizer->zero_grad();
    const Tensor loss_d = bce(d(x), true) + bce(d(perturbed.detach()), false);
    const double norm_d = d.step(loss_d);

    g.optimizer->zero_grad();
    const Tensor loss_g = bce(d(perturbed), true);
    const double norm_g = g.step(loss_g);

    m.optimizer->zero_grad();
    m.ddp.reducer().prepare_forward();  // the MAE is driven through its parts, not ddp(x)
    const models::MAEEncoderOutput enc = M->forward_encoder(perturbed.detach(), config.mask_ratio, noise);
    const Tensor loss_m = M->forward_loss(x, M->forward_decoder(enc.latent, enc.ids_restore), enc.mask);
    const double norm_m = m.step(loss_m);
    run.scaler.update();  // one per iteration, after the three steps
    schedule->step();

    log.step(step, {{"loss_d", loss_d.item()}, {"loss_g", loss_g.item()}, {"loss_mae", loss_m.item()}},
             {{"G", norm_g}, {"D", norm_d}, {"MAE", norm_m}},
             {{"unchanged_params_G", static_cast<double>(g.update.unchanged())},
              {"unchanged_params_D", static_cast<double>(d.update.unchanged())},
              {"unchanged_params_MAE", static_cast<double>(m.update.unchanged())}});
    if (step % o.sample_every == 0 || step == o.steps) write_samples(step);
    if (const auto status = run.end_of_step(step)) return *status;
  }
  if (start >= o.steps) write_samples(start);  // --steps 0: the checkpoint's model
  log.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_main("train_joint", [&] {
    Options o;
    o.steps = 2000;
    o.batch_size = 64;
    o.lr = 2e-4;
    app::Flags flags("train_joint",
                     "Trains a perturbing generator G, a discriminator D (SyncBatchNorm) and an MAE together,\n"
                     "three DDP models with three optimizers; alone or under mpirun. Writes samples_<step>.png\n"
                     "(original / perturbed / masked / reconstruction), metrics.jsonl, loss_curve.png, ckpt/.");
    app::add_common_flags(flags, o, /*has_batch_norm=*/false);
    app::add_data_flags(flags, o);
    flags.add("--lr-mae", &o.lr_mae, "MAE peak learning rate (AdamW, warmup then cosine); --lr is G's and D's");
    flags.add("--model", &o.model, "MAE configuration: tiny or small (default tiny on cpu, small on cuda)", "NAME");
    flags.add("--gwidth", &o.gwidth, "perturber width");
    flags.add("--ndf", &o.ndf, "discriminator width");
    flags.parse(argc, argv);
    return train(o);
  });
}
