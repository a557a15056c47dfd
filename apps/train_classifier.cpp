// train_classifier: the small CNN of models/classifier.h on Fashion-MNIST with Adam and
// cross-entropy, under DistributedDataParallel with default options. At the end it
// reports the test accuracy (stdout and metrics.jsonl) and saves the weights to
// DIR/classifier.safetensors: the feature network of train_gan --eval (FID).
#include <algorithm>
#include <string>

#include "common/flags.h"
#include "common/train.h"

namespace {

using nd::Tensor;
namespace models = nd::models;

// Fraction of the test set classified correctly (eval mode, no communication).
// (the first n test images).
double test_accuracy(models::Classifier& model, const nd::data::Dataset& test, int64_t n, nd::Device device) {
  model->eval();
  const Tensor logits =
      app::map_chunks(test.images.narrow(0, 0, n), 1000, device, [&](const Tensor& x) { return model->forward(x); });
  model->train();
  const Tensor correct = logits.argmax(1).eq(test.labels.narrow(0, 0, n)).to(nd::kFloat64).sum();
  return correct.item() / static_cast<double>(n);
}

struct Options : app::CommonOptions {
  int64_t test_images = 10000;
};

int train(Options& o) {
  const app::World world = app::world();
  const nd::Device device = app::setup("train_classifier", o, world);
  const nd::AutocastGuard amp(device.type, o.amp, app::amp_dtype(o));  // --amp (engine/autocast.h)
  nd::optim::GradScaler scaler(app::grad_scaler_options(o));  // on for --amp-dtype f16 only
  const nd::data::Dataset train_set = nd::data::load_fashion_mnist(o.data, true);
  const nd::data::Dataset test_set = nd::data::load_fashion_mnist(o.data, false);
  o.test_images = std::min(o.test_images, test_set.labels.size(0));

  nd::manual_seed(static_cast<uint64_t>(o.seed));
  models::Classifier C;
  if (o.sync_bn) nd::nn::convert_sync_batchnorm(C.ptr());
  C->to(device);
  nd::dist::DistributedDataParallel c(C, "classifier", app::ddp_options(device));
  auto opt = app::make_optimizer<nd::optim::Adam>(o, c.reducer(), nd::optim::AdamOptions(o.lr));  // --zero

  app::BatchStream batches(train_set, o.batch_size, static_cast<uint64_t>(o.seed), world, device);
  nd::TrainState state{{{"classifier", C.get()}}, {{"classifier", opt.get()}}, {}, 0, {{"amp", &scaler}}, {}};
  app::register_comm_hook(c.reducer(), o, state);  // --comm-hook
  const int64_t start = o.resume ? app::load_checkpoint(o, state, batches) : 0;

  app::Logger log("train_classifier", o, world, start);
  log.watch(&scaler);
  log.say("train_classifier: " + std::to_string(world.size) + " rank(s), device " + device.str() +
          ", global batch " + std::to_string(o.batch_size) + ", steps " + std::to_string(start + 1) + ".." +
          std::to_string(o.steps) + ", output " + o.out);
  app::UpdateNorm update(C->parameters());
  for (int64_t step = start + 1; step <= o.steps; ++step) {
    const nd::data::Batch batch = batches.next();
    opt->zero_grad();
    const Tensor logits = c(batch.images);
    const Tensor loss = nd::cross_entropy(logits, batch.labels);
    scaler.scale(loss).backward();
    update.before();
    scaler.step(*opt);
    scaler.update();
    const double norm = update.after();
    const double accuracy = logits.argmax(1).eq(batch.labels).to(nd::kFloat64).mean().item();
    state.step = step;
    log.step(step, {{"loss", loss.item()}}, {{"classifier", norm}}, {{"batch_accuracy", accuracy}});
    if (const auto status = app::end_of_step(o, world, state, batches, log, step)) return *status;
  }
  if (world.rank0()) {
    log.record(std::max(start, o.steps), {{"test_accuracy", test_accuracy(C, test_set, o.test_images, device)}});
    nd::save(C->state_dict(), o.out + "/classifier.safetensors",
             {{"width", std::to_string(C->width)}, {"feature_dim", std::to_string(C->feature_dim)}});
    log.say("wrote " + o.out + "/classifier.safetensors");
  }
  log.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_main("train_classifier", [&] {
    Options o;
    o.steps = 1500;
    o.batch_size = 128;
    o.lr = 1e-3;
    o.log_every = 50;
    o.ckpt_every = 500;
    app::Flags flags("train_classifier",
                     "Trains the Fashion-MNIST CNN classifier (the FID feature network); alone or under mpirun.\n"
                     "Writes classifier.safetensors, metrics.jsonl, loss_curve.png and ckpt/ to --out.");
    app::add_common_flags(flags, o, /*has_batch_norm=*/true);
    flags.add("--test-images", &o.test_images, "test images for the final accuracy (the first N)");
    flags.parse(argc, argv);
    o.run_flags = flags.values_markdown();
    return train(o);
  });
}
