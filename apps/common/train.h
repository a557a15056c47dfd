#pragma once
// What every training app shares: the common flags, start-up checks, the rank's view
// of the world, a stream of this rank's batches that can seek (exact resume), the
// per-model "norm of the last update" tracker, the logger (progress bar on a terminal,
// plain lines otherwise, metrics.jsonl, TensorBoard event files, the loss-curve PNG) and checkpoint glue over
// save_train_state. Rank 0 writes every file; every rank runs the same collectives.
// Tests: tests/apps/apps_test.cpp, tests/dist/apps_dist_test.cpp.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanoddp.h>

#include "common/data.h"
#include "common/flags.h"
#include "common/png.h"

namespace app {

// --amp-dtype's values, in the order of kAmpDtypes.
enum class AmpDtype { kBf16, kF16 };
inline const std::vector<std::string> kAmpDtypes{"bf16", "f16"};
// --comm-hook's values, in the order of kCommHooks: f32 all-reduce, bf16 / fp16
// compression, PowerSGD.
enum class CommHook { kNone, kBf16, kFp16, kPowerSGD };
inline const std::vector<std::string> kCommHooks{"none", "bf16", "fp16", "powersgd"};

struct CommonOptions {
  std::string device = "cpu";
  int64_t steps = 1000;
  int64_t batch_size = 64;  // global: split evenly over the ranks
  double lr = 1e-3;
  std::string out;          // default out/<program>
  bool resume = false;
  bool overwrite = false;   // --overwrite: delete the run already in --out (holds_run) before writing
  int64_t seed = 0;
  std::string data = nd::data::kFashionMnistDir;
  int64_t log_every = 50;
  int64_t sample_every = 500;
  int64_t ckpt_every = 500;
  bool sync_bn = false;
  bool amp = false;
  std::optional<AmpDtype> amp_dtype;  // --amp-dtype (bf16 when not given)
  int64_t exit_after = 0;  // stop after this step, checkpoint written (as if killed); 0: off
  bool no_tensorboard = false;
  std::string run_flags;    // every flag's value (Flags::values_markdown), TensorBoard's "flags" text
  CommHook comm_hook = CommHook::kNone;  // --comm-hook (DDP communication hook)
  int64_t powersgd_rank = 1;       // --powersgd-rank: PowerSGD's matrix_approximation_rank
  bool zero = false;               // --zero: ZeroRedundancyOptimizer (optimizer state sharded over the ranks)
  const Flags* flags = nullptr;    // set by add_common_flags: setup() asks which flags were given

  // Whether `step` ends with a checkpoint: every ckpt_every, the last and the exit step.
  bool checkpoint_at(int64_t step) const { return step % ckpt_every == 0 || step == steps || step == exit_after; }
};

// Adds --device --steps --batch-size --lr --out --resume --overwrite --seed --data --log-every
// --sample-every --ckpt-every --exit-after --amp --amp-dtype --no-tensorboard --comm-hook
// --powersgd-rank --zero, and --sync-bn when the app has BatchNorm.
void add_common_flags(Flags& flags, CommonOptions& options, bool has_batch_norm);

struct World {
  int rank = 0, size = 1;
  bool rank0() const { return rank == 0; }
};
World world();

// Whether folder `dir` holds a run: it has DIR/metrics.jsonl or DIR/ckpt/latest.safetensors.
bool holds_run(const std::string& dir);

// Checks what the flags alone cannot (the device exists, the batch divides by
// the world size), fills in --out's default, and returns the device ("cuda" without an
// index: this rank's GPU, cuda:<local rank>). One run, one folder: when --out holds a run
// (rank 0 looks, every rank gets its answer) and neither --resume nor --overwrite was
// given, a UsageError naming both. Creates nothing: the Logger creates DIR, the first
// checkpoint DIR/ckpt. Throws UsageError or nd::Error.
nd::Device setup(const std::string& program, CommonOptions& options, const World& world);

// --amp's operand dtype for the AutocastGuard: kBFloat16, or kFloat16 with --amp-dtype f16.
nd::ScalarType amp_dtype(const CommonOptions& options);
// The apps' GradScaler: on under --amp --amp-dtype f16 (f16 needs loss scaling), else off
// (every call passes through, so one code path serves f32, bf16 and f16). Its scale and
// growth count go into the checkpoint (TrainState::scalers), so --resume continues them.
nd::optim::GradScalerOptions grad_scaler_options(const CommonOptions& options);

// DDP's options for a model on `device`, over dist::default_group(device): world() (MPI)
// for the CPU, nccl_world() for CUDA, and for a GPU in a world of one process no group
// (nothing to communicate, no NCCL needed). SyncBatchNorm needs no helper:
// nn::convert_sync_batchnorm(module) takes the same default group from its input's device.
nd::dist::DistributedDataParallelOptions ddp_options(nd::Device device);
// --comm-hook on one DDP model, right after wrapping it: bf16 / fp16 compression, or
// PowerSGD at --powersgd-rank from a tenth of --steps on (PyTorch's advice for
// start_powerSGD_iter), whose state joins `state` as "powersgd.<model>" so that --resume
// continues it.
void register_comm_hook(nd::dist::Reducer& reducer, const CommonOptions& options, nd::TrainState& state);

// The app's optimizer O over the parameters of a DDP model; with --zero a
// dist::ZeroRedundancyOptimizer wrapping O and given the model (ZeRO stage 2: DDP
// reduce-scatters its buckets, each rank keeps O's state for its 1/W of the elements). The
// training is the same (tests/dist/zero_test.cpp) and the checkpoint holds the whole state,
// so --resume works at any world size, with or without --zero.
template <class O, class Options>
std::unique_ptr<nd::optim::Optimizer> make_optimizer(const CommonOptions& options, nd::dist::Reducer& ddp,
                                                     const Options& optimizer_options) {
  if (options.zero)
    return nd::dist::ZeroRedundancyOptimizer::make<O>(ddp.parameters(), optimizer_options,
                                                      nd::dist::ZeroRedundancyOptimizerOptions().ddp(&ddp));
  return std::make_unique<O>(ddp.parameters(), optimizer_options);
}

// Runs body, turning a UsageError into "<program>: <message>" + exit status 2 (printed
// by rank 0: every rank checks the same command line) and any other error into
// "<program>: error: <message>" + exit status 1 (by every rank that hits it), each on
// one line.
int run_main(const std::string& program, const std::function<int()>& body);

// Rows rank, rank + W, rank + 2W, ... of a tensor drawn for the whole global batch:
// this rank's part, in the order DistributedSampler interleaves samples, so that N
// ranks see the same noise per sample as one process.
nd::Tensor shard_rows(const nd::Tensor& global, const World& world);

// This rank's batches, forever: a DistributedSampler shard (shuffled per epoch from the
// seed) cut into batches of global_batch / W, last partial batch dropped. The k-th
// batches of N ranks together are the k-th batch of one process. Its position is the
// number of batches consumed, so a checkpoint stores one integer.
class BatchStream {
 public:
  BatchStream(nd::data::Dataset dataset, int64_t global_batch, uint64_t seed, const World& world,
              nd::Device device);
  // --data's training set (load_train_data), image data read by --workers threads.
  BatchStream(const TrainData& data, const DataOptions& options, int64_t global_batch, uint64_t seed,
              const World& world, nd::Device device);
  nd::data::Batch next();
  // Restarts so that the next batch is number `consumed` (counting from 0 at epoch 0).
  void seek(int64_t consumed);
  int64_t consumed() const { return consumed_; }
  int64_t batches_per_epoch() const { return per_epoch_; }
  int64_t epoch() const { return consumed_ / per_epoch_; }
  // The files --skip-unreadable left out so far (this rank's).
  std::vector<nd::data::SkippedSample> skipped() const { return loader_->skipped(); }

 private:
  // The rank's loader options: a DistributedSampler shard of n samples, batches of global_batch / W.
  static nd::data::DataLoaderOptions shard_options(int64_t n, int64_t global_batch, uint64_t seed, const World& world,
                                                   nd::Device device);
  std::unique_ptr<nd::data::DataLoader> loader_;
  nd::Device device_;
  int64_t per_epoch_ = 1, consumed_ = 0;
};

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

// Named values of one step.
using Values = std::vector<std::pair<std::string, double>>;

// Progress and metrics. step() takes every step's losses (names starting with "loss";
// averaged over the ranks and the log window, and drawn in loss_curve.png), update norms
// and other values (this rank's last ones, metrics.jsonl only). Every log_every steps
// (and at the last step) it writes one metrics.jsonl line and a plain line, or on a
// terminal keeps a progress bar current (one rank only: mpirun hands every rank a
// pseudo-terminal, also when its output goes to a file). record() writes an extra line
// (eval results). With watch(scaler) on an enabled GradScaler, every line also has its
// "amp_scale" (a scale that keeps falling means skipped steps). A line whose window is not
// log_every steps (the first after a resume, the last, a stop's) says how many it averages:
// "steps_averaged".
// Graceful stop: from the first step() to the last, SIGINT and SIGTERM only set a flag (the
// handler also puts back both signals' default action, so a second one ends the process at
// once); every step() agrees on it over the ranks (a max all-reduce of one integer) and a
// stop step logs its window, so that end_of_step stops every rank after the same step.
// Unless --no-tensorboard, rank 0 also writes TensorBoard event files to DIR: every
// metrics.jsonl number as a scalar (its text values as text), the flags as text once,
// sample grids as images, and at log steps the histograms of watched models' parameters.
class Logger {
 public:
  Logger(std::string program, const CommonOptions& options, const World& world, int64_t start_step);
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;
  void step(int64_t step, const Values& losses, const Values& update_norms, const Values& other = {});
  // Writes {"step": step, values..., text...} and prints it.
  void record(int64_t step, const Values& values, const std::map<std::string, std::string>& text = {});
  // A line of text for the user (rank 0), not breaking the progress bar.
  void say(const std::string& text);
  void watch(const nd::optim::GradScaler* scaler) { scaler_ = scaler; }
  // Histograms of the module's parameters ("<name>/<parameter>") at every log step.
  void watch(const std::string& name, const nd::nn::Module& module) { watched_.emplace_back(name, &module); }
  // An image for TensorBoard (rank 0; nothing with --no-tensorboard).
  void add_image(const std::string& tag, const Image& image, int64_t step);
  // Finishes the bar and draws DIR/loss_curve.png from every logged loss.
  void finish();
  // The signal (SIGINT, SIGTERM) any rank got by the last step(); 0: none.
  int stop_signal() const { return stop_signal_; }
  // Puts the signals' default action back (after the last step: nothing left to save); a
  // signal that arrived since the last step() takes its default effect now.
  void stop_listening();
  const std::string& program() const { return program_; }

 private:
  void write_line(int64_t step, const Values& values, const std::map<std::string, std::string>& text);
  void print_line(const std::string& line, bool permanent);

  std::string program_, out_;
  nd::Device device_;  // this rank's --device
  World world_;
  int64_t total_, log_every_, start_step_;
  bool terminal_;
  std::chrono::steady_clock::time_point started_, last_draw_;
  std::vector<double> window_sums_;
  std::vector<std::string> loss_names_;
  int64_t window_ = 0;
  std::vector<Series> curves_;
  bool bar_open_ = false;
  const nd::optim::GradScaler* scaler_ = nullptr;
  std::unique_ptr<nd::tensorboard::SummaryWriter> tensorboard_;  // rank 0, unless --no-tensorboard
  std::vector<std::pair<std::string, const nd::nn::Module*>> watched_;
  bool listening_ = false;
  int stop_signal_ = 0;
};

// Checkpoints: DIR/ckpt/latest.safetensors, written atomically by rank 0 through
// save_train_state, with the batch stream's position and the world size in its metadata.
std::string checkpoint_path(const CommonOptions& options);
void save_checkpoint(const CommonOptions& options, const World& world, nd::TrainState& state,
                     const BatchStream& batches);
// Loads the checkpoint into `state` (every rank), seeks the batch stream and returns
// the step to continue from. Throws nd::Error when there is none, UsageError when --steps
// is not 0 (only evaluate) and not above the checkpoint's step (nothing loaded then).
int64_t load_checkpoint(const CommonOptions& options, nd::TrainState& state, BatchStream& batches);

// The end of every training step, on every rank, after Logger::step and the step's samples:
// the checkpoint when checkpoint_at(step) or a stop signal came (log.stop_signal()), and
// whether the loop ends here (then also every rank's files --skip-unreadable left out): the exit status, 0 after --exit-after's step, 128 + the
// signal (130 SIGINT, 143 SIGTERM) after a stop, which also draws loss_curve.png and
// prints where it stopped and the command that continues (--resume); nullopt: go on.
std::optional<int> end_of_step(const CommonOptions& options, const World& world, nd::TrainState& state,
                               const BatchStream& batches, Logger& log, int64_t step);

// Rank 0: writes DIR/samples_<step>.png (six digits), tells the user, and adds the grid
// to TensorBoard as the image "samples".
void save_samples(Logger& logger, const World& world, const CommonOptions& options, int64_t step, const Image& image);

// Runs forward passes in chunks under NoGradGuard: fn(images chunk) -> [n, ...].
nd::Tensor map_chunks(const nd::Tensor& images, int64_t chunk, nd::Device device,
                      const std::function<nd::Tensor(const nd::Tensor&)>& fn);

}  // namespace app
