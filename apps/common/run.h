#pragma once
// One training run as every DDP app sets it up: Run holds the world, the device, --amp's
// autocast, the GradScaler, the TrainState the checkpoint saves, the batch stream and the
// Logger, keeps one run per --out folder and writes the checkpoint DIR/ckpt/latest.safetensors
// (atomically, by rank 0, with the batch stream's position in its metadata); Run::wrap puts
// a model under DDP with its optimizer (ZeRO under --zero) and its --comm-hook; each app
// keeps its models and its step. Also run_main (exit statuses), UpdateNorm and the small
// helpers the apps share. Tests: tests/apps/apps_test.cpp, tests/apps/apps_runs_test.cpp,
// tests/dist/apps_dist_test.cpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanoddp.h>

#include "common/batches.h"
#include "common/data.h"
#include "common/logger.h"
#include "common/options.h"
#include "common/png.h"

namespace app {

// The L2 norm of one optimizer step's change to a model's parameters:
// before() snapshots them, after() returns ||p_after - p_before||.
class UpdateNorm {
 public:
  explicit UpdateNorm(std::vector<nd::Tensor> params) : params_(std::move(params)) {}
  void before();
  double after();
  // Parameters that after() found exactly unchanged (a frozen model: all of them).
  int64_t unchanged() const { return unchanged_; }

 private:
  std::vector<nd::Tensor> params_, snapshot_;
  int64_t unchanged_ = 0;
};

// A model's optimizer and what its step needs: the run's GradScaler and the update norm.
struct Optimized {
  std::unique_ptr<nd::optim::Optimizer> optimizer;
  UpdateNorm update;
  nd::optim::GradScaler* scaler;
  // Backward of the scaled loss, then the scaler's step of the optimizer (skipped when a
  // gradient overflowed); returns the update's norm. The caller zeroes the gradients
  // before and calls scaler->update() once per iteration after every model's step.
  double step(const nd::Tensor& loss);
};

// A model under DistributedDataParallel (Run::wrap): model(x) is ddp(x), its forward with
// DDP's bookkeeping.
template <class Holder>
struct DdpModel : Optimized {
  DdpModel(Optimized optimized, nd::dist::DistributedDataParallel<Holder> ddp)
      : Optimized(std::move(optimized)), ddp(std::move(ddp)) {}
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return ddp(std::forward<Args>(args)...);
  }
  nd::dist::DistributedDataParallel<Holder> ddp;
};

// Made first in an app's train(), it checks what the flags alone cannot (the device
// exists, the batch divides by the world size, the flags that need or exclude others),
// fills in --out's default and turns on --amp's autocast for its lifetime. One run, one
// folder: when --out holds a run (rank 0 looks, every rank gets its answer) and neither
// --resume nor --overwrite was given, a UsageError naming both. Creates nothing: start()
// opens the Logger, which creates DIR, and the first checkpoint DIR/ckpt. Throws UsageError
// or nd::Error.
class Run {
 public:
  Run(std::string program, CommonOptions& options);

  const std::string program;
  CommonOptions& options;
  const World world;
  const nd::Device device;  // --device; "cuda" without an index: this rank's GPU, cuda:<local rank>
  const nd::AutocastGuard autocast;  // --amp: bf16 operands, or f16 with --amp-dtype f16
  // On under --amp --amp-dtype f16 (f16 needs loss scaling), else off: every call passes
  // through, so one code path serves f32, bf16 and f16. In the checkpoint as "amp".
  nd::optim::GradScaler scaler;
  // What the checkpoint holds: wrap() adds each model and optimizer (and PowerSGD's
  // state), the app its schedulers; the Run sets the step.
  nd::TrainState state;

  // `module` under DDP (over dist::default_group(device): MPI on the CPU, NCCL on CUDA, no
  // group for one GPU alone) named `name`, with an optimizer O over its parameters: plain,
  // or under --zero a dist::ZeroRedundancyOptimizer wrapping O and given the model (ZeRO
  // stage 2: DDP reduce-scatters its buckets, each rank keeps O's state for its 1/W of the
  // elements; the training and the checkpoint are the same, so --resume works at any world
  // size, with or without --zero). --comm-hook bf16 / fp16 compresses its gradients,
  // powersgd runs PowerSGD at --powersgd-rank from a tenth of --steps on (PyTorch's
  // advice), its state in the checkpoint as "powersgd.<name>". Model and optimizer join
  // `state` as `name`. The module is on `device` already. `groups`: the optimizer's
  // parameter groups, each with its own options (models::mae_param_groups), holding every
  // parameter DDP reduces once; empty: one group of them all with optimizer_options.
  template <class O, class Holder, class OptimizerOptions>
  DdpModel<Holder> wrap(const std::string& name, Holder module, const OptimizerOptions& optimizer_options,
                        std::vector<nd::optim::OptimizerParamGroup> groups = {}) {
    nd::dist::DistributedDataParallel<Holder> ddp(module, name, nd::dist::DistributedDataParallelOptions().process_group(
                                                                    nd::dist::default_group(device)));
    nd::dist::Reducer& reducer = ddp.reducer();
    if (groups.empty()) groups.emplace_back(reducer.parameters());
    namespace dist = nd::dist;
    std::unique_ptr<nd::optim::Optimizer> optimizer =
        options.zero ? std::unique_ptr<nd::optim::Optimizer>(std::make_unique<dist::ZeroRedundancyOptimizer>(
                           std::move(groups), dist::ZeroRedundancyOptimizer::optimizer_class<O, OptimizerOptions>(),
                           optimizer_options, dist::ZeroRedundancyOptimizerOptions().ddp(&reducer)))
                     : std::make_unique<O>(std::move(groups), optimizer_options);
    DdpModel<Holder> model(Optimized{std::move(optimizer), UpdateNorm(module->parameters()), &scaler}, std::move(ddp));
    add(name, *module, *model.optimizer, reducer);
    return model;
  }

  // A setting --resume must find unchanged (before start()): `value` goes into the
  // checkpoint's metadata under `flag`, and a checkpoint trained with another value is an
  // nd::Error naming both, before anything is loaded. A checkpoint without it (written
  // before the app recorded the flag) counts as trained with `before`.
  struct Setting {
    std::string flag, value, before;
  };
  void same_on_resume(const std::string& flag, const std::string& value, const std::string& before);

  // After the models, optimizers and schedulers: this rank's batches of the training set
  // (--data's, read by --workers threads; or a data set in memory), the checkpoint loaded
  // into `state` and the batches seeked to its position under --resume, the Logger opened
  // (watching the scaler). Returns the step the run continues after: 0, or the checkpoint's.
  int64_t start(const TrainData& data, const DataOptions& data_options);
  int64_t start(nd::data::Dataset dataset);
  BatchStream& batches() { return *batches_; }
  Logger& log() { return *log_; }

  // The end of every training step, on every rank, after Logger::step and the step's
  // samples: the checkpoint when options.checkpoint_at(step) or a stop signal came
  // (log().stop_signal()), and whether the loop ends here (then also every rank's files
  // --skip-unreadable left out): the exit status, 0 after --exit-after's step, 128 + the
  // signal (130 SIGINT, 143 SIGTERM) after a stop, which also draws loss_curve.png and
  // prints where it stopped and the command that continues (--resume); nullopt: go on.
  std::optional<int> end_of_step(int64_t step);

  // Rank 0: writes DIR/samples_<step>.png (six digits), tells the user, and adds the grid
  // to TensorBoard as the image "samples".
  void save_samples(int64_t step, const Image& image);

 private:
  void add(const std::string& name, nd::nn::Module& module, nd::optim::Optimizer& optimizer,
           nd::dist::Reducer& reducer);
  int64_t start(BatchStream batches);

  std::vector<Setting> same_on_resume_;
  std::optional<BatchStream> batches_;
  std::optional<Logger> log_;
};

// The apps' learning-rate schedule: linear warmup from 1% over `warmup` steps, then a
// cosine over the rest of `steps` (LinearLR then CosineAnnealingLR in a SequentialLR).
std::unique_ptr<nd::optim::LRScheduler> warmup_cosine(nd::optim::Optimizer& optimizer, int64_t warmup, int64_t steps);

// Runs body, turning a UsageError into "<program>: <message>" + exit status 2 (printed
// by rank 0: every rank checks the same command line) and any other error into
// "<program>: error: <message>" + exit status 1 (by every rank that hits it), each on
// one line.
int run_main(const std::string& program, const std::function<int()>& body);

// Runs forward passes in chunks under NoGradGuard: fn(images chunk) -> [n, ...].
nd::Tensor map_chunks(const nd::Tensor& images, int64_t chunk, nd::Device device,
                      const std::function<nd::Tensor(const nd::Tensor&)>& fn);

}  // namespace app
