// train_gan: DCGAN (models/dcgan.h) on Fashion-MNIST, an image folder or CIFAR (--data:
// dcgan28, dcgan32 or dcgan64 by the images' size, channels as the data's) with the
// non-saturating GAN loss (BCE with logits: D learns real -> 1, G(z) -> 0; G learns
// D(G(z)) -> 1), Adam lr 2e-4, betas (0.5, 0.999), both models under
// DistributedDataParallel with default options. Writes DIR/samples_<step>.png (8x8 grid
// from a fixed z, G in eval mode), DIR/metrics.jsonl, DIR/loss_curve.png,
// DIR/ckpt/latest.safetensors; with --eval (Fashion-MNIST), FID in the feature space of
// a classifier trained by train_classifier.
#include <filesystem>
#include <string>

#include "common/fid.h"
#include "common/flags.h"
#include "common/model_select.h"
#include "common/png.h"
#include "common/run.h"

namespace {

using nd::Tensor;
namespace models = nd::models;

struct Options : app::CommonOptions, app::DataOptions {
  std::string model;               // "": the config for the data's image size
  int64_t nz = 0, ngf = 0, ndf = 0;  // 0: the config's
  bool eval = false;
  std::string classifier = "out/train_classifier/classifier.safetensors";
  int64_t eval_samples = 10000;  // the whole test set
  bool paper_recipe = false;     // the defaults' Adam, --lr refused
};

// G(z) in eval mode: BatchNorm uses its running statistics, so sampling neither
// changes training nor communicates (with --sync-bn only rank 0 samples).
Tensor sample(models::DCGANGenerator& G, const Tensor& z) {
  nd::NoGradGuard no_grad;
  G->eval();
  const Tensor images = G->forward(z);
  G->train();
  return images;
}

// FID between `n` samples of G (eval mode) and the first n test images, in the
// penultimate-feature space of the classifier stored at `path`.
double fid(models::DCGANGenerator& G, const std::string& path, const nd::data::Dataset& test, int64_t n, int64_t nz,
           nd::Device device) {
  models::Classifier classifier;
  classifier->load_state_dict(nd::load(path));
  classifier->to(device);
  classifier->eval();
  nd::Generator gen{12345, 0};  // the same z for every evaluation
  const Tensor z = nd::randn({n, nz}, {}, &gen);
  const Tensor fake = app::map_chunks(z, 500, device, [&](const Tensor& c) { return sample(G, c); });
  auto features = [&](const Tensor& c) { return classifier->features(c); };
  const Tensor real_features = app::map_chunks(test.images.narrow(0, 0, n), 500, device, features);
  const Tensor fake_features = app::map_chunks(fake, 500, device, features);
  return app::frechet_distance(fake_features, real_features);
}

int train(Options& o) {
  app::Run run("train_gan", o);
  const nd::Device device = run.device;
  if (o.paper_recipe && o.flags && o.flags->given("--lr"))
    throw app::UsageError{"--paper-recipe and --lr cannot be combined: the DCGAN paper's lr is 2e-4"};
  if (o.eval && o.eval_samples > 10000) throw app::UsageError{"--eval-samples is at most 10000 (the test set)"};
  const app::TrainData train_set = app::load_train_data(o.data, o, run.world);
  if (o.eval && !train_set.is_idx())
    throw app::UsageError{"--eval: FID uses the features of a Fashion-MNIST classifier; --data " + o.data + " holds " +
                          train_set.kind + " images"};
  const nd::data::Dataset test_set = o.eval ? nd::data::load_fashion_mnist(o.data, false) : nd::data::Dataset{};
  if (o.eval) ND_CHECK(std::filesystem::exists(o.classifier), "--classifier: no file at ", o.classifier,
                       " (train one with train_classifier, or pass --classifier PATH)");

  // The data decides the image size and channels (app/common/model_select.h); --nz, --ngf,
  // --ndf over the config's.
  models::DCGANConfig config = app::dcgan_config(o.model, train_set.shape());
  auto take = [](int64_t& flag, int64_t& field) { flag ? void(field = flag) : void(flag = field); };
  take(o.nz, config.nz), take(o.ngf, config.ngf), take(o.ndf, config.ndf);
  if (o.model.empty()) {
    const int64_t s = config.image_size;
    o.model = s == 28 || s == 32 || s == 64 ? "dcgan" + std::to_string(s) : "dcgan28's widths";
  }

  nd::manual_seed(static_cast<uint64_t>(o.seed));
  models::DCGANGenerator G(config);
  models::DCGANDiscriminator D(config);
  models::dcgan_init(*G);
  models::dcgan_init(*D);
  if (o.sync_bn) {
    nd::nn::convert_sync_batchnorm(G.ptr());
    nd::nn::convert_sync_batchnorm(D.ptr());
  }
  G->to(device);
  D->to(device);
  const nd::optim::AdamOptions adam =
      o.paper_recipe ? models::dcgan_adam_options() : models::dcgan_adam_options().lr(o.lr);
  auto g = run.wrap<nd::optim::Adam>("G", G, adam);
  auto d = run.wrap<nd::optim::Adam>("D", D, adam);
  const int64_t start = run.start(train_set, o);
  nd::Generator sample_gen{static_cast<uint64_t>(o.seed) + 1, 0};
  const Tensor fixed_z = nd::randn({64, o.nz}, {}, &sample_gen).to(device);

  app::Logger& log = run.log();
  log.say("train_gan: " + std::to_string(run.world.size) + " rank(s), device " + device.str() + ", global batch " +
          std::to_string(o.batch_size) + ", steps " + std::to_string(start + 1) + ".." + std::to_string(o.steps) +
          ", model " + o.model + ", nz " + std::to_string(o.nz) + ", ngf " + std::to_string(o.ngf) + ", ndf " +
          std::to_string(o.ndf) + ", " + train_set.describe() +
          ", output " + o.out);
  if (o.paper_recipe) {
    const auto v = g.optimizer->param_groups()[0].options().to_map();
    log.say("train_gan: the paper's recipe: Adam lr " + app::format_double(v.at("lr")) + ", betas (" +
            app::format_double(v.at("beta1")) + ", " + app::format_double(v.at("beta2")) + ") for G and D");
  }
  auto bce = [](const Tensor& logits, double target) {
    return nd::binary_cross_entropy_with_logits(logits, target > 0.5 ? nd::ones_like(logits) : nd::zeros_like(logits));
  };
  auto write_samples = [&](int64_t step) {
    if (!run.world.rank0()) return;
    const Tensor images = sample(G, fixed_z);
    run.save_samples(step, app::image_grid(images, 8));
  };
  auto evaluate = [&](int64_t step) {
    if (!o.eval || !run.world.rank0()) return;
    log.record(step, {{"fid", fid(G, o.classifier, test_set, o.eval_samples, o.nz, device)}},
               {{"fid_features", o.classifier}});
  };

  for (int64_t step = start + 1; step <= o.steps; ++step) {
    const Tensor real = run.batches().next().images;
    // z for the whole global batch, then this rank's rows: N ranks = one process.
    const Tensor z = app::shard_rows(nd::randn({o.batch_size, o.nz}), run.world).to(device);
    const Tensor fake = g(z);

    d.optimizer->zero_grad();
    const Tensor loss_d = bce(d(real), 1.0) + bce(d(fake.detach()), 0.0);
    const double norm_d = d.step(loss_d);

    g.optimizer->zero_grad();
    const Tensor loss_g = bce(d(fake), 1.0);
    const double norm_g = g.step(loss_g);
    run.scaler.update();  // one per iteration, after both steps (a skip in either backs off)

    log.step(step, {{"loss_d", loss_d.item()}, {"loss_g", loss_g.item()}}, {{"G", norm_g}, {"D", norm_d}});
    if (step % o.sample_every == 0 || step == o.steps) {
      write_samples(step);
      if (step != o.steps) evaluate(step);
    }
    if (const auto status = run.end_of_step(step)) return *status;
  }
  if (start >= o.steps) write_samples(start);  // --steps 0: the checkpoint's model
  evaluate(std::max(start, o.steps));
  log.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_main("train_gan", [&] {
    Options o;
    o.steps = 2500;
    o.batch_size = 64;
    o.lr = 2e-4;
    app::Flags flags("train_gan",
                     "Trains a DCGAN (generator + discriminator) on Fashion-MNIST, an image folder or CIFAR;\n"
                     "alone or under mpirun.\n"
                     "Writes samples_<step>.png, metrics.jsonl, loss_curve.png and ckpt/ to --out.");
    app::add_common_flags(flags, o, /*has_batch_norm=*/true);
    app::add_data_flags(flags, o);
    flags.add("--model", &o.model,
              "DCGAN configuration: dcgan28, dcgan32 or dcgan64 (default: the one for the data's image size)",
              "NAME");
    flags.add("--nz", &o.nz, "latent size (0: the config's, 64 for dcgan28, 100 for dcgan32/64)");
    flags.add("--ngf", &o.ngf, "generator width (0: the config's, 32 for dcgan28, 64 for dcgan32/64)");
    flags.add("--ndf", &o.ndf, "discriminator width (0: the config's, 32 for dcgan28, 64 for dcgan32/64)");
    flags.add("--paper-recipe", &o.paper_recipe,
              "the DCGAN paper's optimizer, Adam lr 2e-4, betas (0.5, 0.999), for G and D (the defaults; with it "
              "--lr is refused)");
    flags.add("--eval", &o.eval, "FID vs the test set at each sample step and the end (needs --classifier)");
    flags.add("--classifier", &o.classifier, "classifier weights from train_classifier (FID features)", "PATH");
    flags.add("--eval-samples", &o.eval_samples, "generated and test images per FID", 2);
    flags.parse(argc, argv);
    return train(o);
  });
}
