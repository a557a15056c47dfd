#include "common/run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

namespace app {

namespace fs = std::filesystem;

namespace {

// Whether folder `dir` holds a run: it has DIR/metrics.jsonl or DIR/ckpt/latest.safetensors.
bool holds_run(const std::string& dir) {
  return fs::exists(fs::path(dir) / "metrics.jsonl") || fs::exists(fs::path(dir) / "ckpt" / "latest.safetensors");
}

// `word` as a POSIX shell reads it: as it is when it is plain, else in single quotes.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789_./:=,+-@%") == std::string::npos;
  if (plain) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The command line that continues this run: this one without --overwrite, with --resume
// (under mpirun prefixed with "mpirun -np W", the other mpirun options being unknown here).
std::string resume_command(const CommonOptions& o, const World& world) {
  std::string out = world.size > 1 ? "mpirun -np " + std::to_string(world.size) + " " : "";
  bool resume = false;
  const std::vector<std::string> words = o.flags ? o.flags->command_line() : std::vector<std::string>{};
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--overwrite") continue;
    resume = resume || words[i] == "--resume";
    out += (i ? " " : "") + shell_word(words[i]);
  }
  return resume ? out : out + " --resume";
}

// The checkpoint, written atomically by rank 0 through save_train_state, with the batch
// stream's position and the world size in its metadata.
std::string checkpoint_path(const CommonOptions& o) { return o.out + "/ckpt/latest.safetensors"; }

void save_checkpoint(const CommonOptions& o, const World& world, nd::TrainState& state, const BatchStream& batches,
                     std::map<std::string, std::string> metadata) {
  const nd::TensorDict collected = nd::train_state_dict(state);  // every rank: PowerSGD gathers its errors
  if (!world.rank0()) return;
  std::error_code ec;
  fs::create_directories(fs::path(o.out) / "ckpt", ec);
  ND_CHECK(!ec, "cannot create the checkpoint folder ", o.out, "/ckpt: ", ec.message());
  metadata.insert({{"batches_consumed", std::to_string(batches.consumed())},
                   {"epoch", std::to_string(batches.epoch())},
                   {"global_batch_size", std::to_string(o.batch_size)},
                   {"seed", std::to_string(o.seed)}});
  nd::save_train_state(checkpoint_path(o), collected, state, metadata, world.size);
}

// Loads the checkpoint into `state` (every rank), seeks the batch stream and returns
// the step to continue from. Throws nd::Error when there is none or it was trained with
// another of the `same` settings (Run::same_on_resume), UsageError when --steps is not 0
// (only evaluate) and not above the checkpoint's step (nothing loaded then).
int64_t load_checkpoint(const CommonOptions& o, const std::vector<Run::Setting>& same, nd::TrainState& state,
                        BatchStream& batches) {
  const std::string path = checkpoint_path(o);
  ND_CHECK(fs::exists(path), "--resume: no checkpoint at ", path, " (train without --resume first)");
  const auto header = nd::load_metadata(path);
  if (o.steps != 0) {
    const auto step = header.find("step");
    if (step != header.end() && std::stoll(step->second) >= o.steps)
      throw UsageError{"--resume: the checkpoint " + path + " is at step " + step->second + " and --steps is " +
                       std::to_string(o.steps) + ": nothing to train (give --steps above " + step->second +
                       ", or --steps 0 to only evaluate)"};
  }
  for (const Run::Setting& s : same) {
    const auto it = header.find(s.flag);
    const std::string trained = it == header.end() ? s.before : it->second;
    ND_CHECK(trained == s.value, "--resume: ", path, " was trained with ", s.flag, " ", trained, ", this run has ",
             s.flag, " ", s.value, "; use the same setting");
  }
  auto meta = nd::load_train_state(path, state);
  ND_CHECK(meta.count("batches_consumed") && meta.count("global_batch_size"), path,
           " was not written by a training app (no batches_consumed / global_batch_size metadata)");
  ND_CHECK(meta["global_batch_size"] == std::to_string(o.batch_size), "--resume: ", path, " was trained with --batch-size ",
           meta["global_batch_size"], ", this run has ", o.batch_size, "; use the same global batch");
  ND_CHECK(meta["seed"] == std::to_string(o.seed), "--resume: ", path, " was trained with --seed ", meta["seed"],
           ", this run has ", o.seed);
  batches.seek(std::stoll(meta["batches_consumed"]));
  return state.step;
}

// --device D on this rank: D, where "cuda" is this rank's GPU (cuda:<local rank>).
nd::Device rank_device(const std::string& flag) {
  const nd::Device device(flag);
  return device.is_cuda() && flag == "cuda" ? nd::Device(nd::kCUDA, nd::dist::local_rank()) : device;
}

// The Run's checks and its device (class Run).
nd::Device checked_device(const std::string& program, CommonOptions& o, const World& world) {
  nd::Device device = nd::kCPU;
  try {
    device = rank_device(o.device);
  } catch (const nd::Error& e) {
    throw UsageError{std::string("--device: ") + e.what()};
  }
  nd::cuda::check_device(device);  // one clear line when CUDA or the GPU is missing
  if (o.batch_size % world.size != 0)
    throw UsageError{"--batch-size " + std::to_string(o.batch_size) + " does not divide by the world size " +
                     std::to_string(world.size) + " (each rank takes batch-size / world-size samples)"};
  if (o.amp_dtype && !o.amp)
    throw UsageError{"--amp-dtype " + kAmpDtypes[static_cast<size_t>(*o.amp_dtype)] + " needs --amp"};
  if (o.flags && o.flags->given("--powersgd-rank") && o.comm_hook != CommHook::kPowerSGD)
    throw UsageError{"--powersgd-rank " + std::to_string(o.powersgd_rank) + " needs --comm-hook powersgd"};
  if (o.zero && o.comm_hook != CommHook::kNone)
    throw UsageError{"--zero and --comm-hook " + kCommHooks[static_cast<size_t>(o.comm_hook)] +
                     " cannot be combined: ZeRO reduce-scatters DDP's gradient buckets itself"};
  if (o.resume && o.overwrite)
    throw UsageError{"--resume and --overwrite cannot be combined: --resume continues the run in --out, "
                     "--overwrite deletes it"};
  if (o.out.empty()) o.out = "out/" + program;
  // One run, one folder. Rank 0 looks (it writes every file) and tells the others, so
  // that every rank refuses or none does.
  if (world.max(!o.resume && !o.overwrite && world.rank0() && holds_run(o.out))) {
    std::string what = "metrics.jsonl";
    const std::string ckpt = checkpoint_path(o);
    if (world.rank0() && fs::exists(ckpt)) {
      what = fs::exists(fs::path(o.out) / "metrics.jsonl") ? "metrics.jsonl and a checkpoint" : "a checkpoint";
      try {
        what += " at step " + nd::load_metadata(ckpt).at("step");
      } catch (const std::exception&) {  // unreadable: the message still names the folder
      }
    }
    throw UsageError{"--out " + o.out + " already holds a run (" + what +
                     "): add --resume to continue it, or --overwrite to delete its files and start again"};
  }
  return device;
}

// Every rank's files --skip-unreadable left out, one a line.
void report_skipped(const std::string& program, const BatchStream& batches, const World& world, Logger& log) {
  const auto skipped = batches.skipped();
  if (skipped.empty()) return;
  std::string text = program + ": --skip-unreadable: rank " + std::to_string(world.rank) + " left out " +
                     std::to_string(skipped.size()) + " unreadable file(s):";
  for (const auto& s : skipped) text += "\n  " + s.error;
  if (world.rank0()) log.say(text);
  else std::printf("%s\n", text.c_str());
}

}  // namespace

Run::Run(std::string program_name, CommonOptions& o)
    : program(std::move(program_name)), options(o), world(app::world()), device(checked_device(program, o, world)),
      autocast(device.type, o.amp, o.amp_dtype == AmpDtype::kF16 ? nd::kFloat16 : nd::kBFloat16),
      scaler(nd::optim::GradScalerOptions().enabled(o.amp && o.amp_dtype == AmpDtype::kF16)),
      state{{}, {}, {}, 0, {{"amp", &scaler}}, {}} {}

void Run::add(const std::string& name, nd::nn::Module& module, nd::optim::Optimizer& optimizer,
              nd::dist::Reducer& reducer) {
  namespace dist = nd::dist;
  state.modules.emplace_back(name, &module);
  state.optimizers.emplace_back(name, &optimizer);
  const CommonOptions& o = options;
  if (o.comm_hook == CommHook::kBf16 || o.comm_hook == CommHook::kFp16) {
    auto hook = o.comm_hook == CommHook::kBf16 ? dist::bf16_compress_hook : dist::fp16_compress_hook;
    reducer.register_comm_hook([hook](dist::GradBucket& bucket) { return hook(nullptr, bucket); },
                               dist::comm_hook_name(hook));
  } else if (o.comm_hook == CommHook::kPowerSGD) {
    auto powersgd = std::make_shared<dist::PowerSGDState>(
        dist::PowerSGDOptions().matrix_approximation_rank(o.powersgd_rank).start_powerSGD_iter(o.steps / 10));
    reducer.register_comm_hook([powersgd](dist::GradBucket& bucket) { return dist::powerSGD_hook(powersgd.get(), bucket); },
                               dist::describe_comm_hook(powersgd.get(), dist::powerSGD_hook));
    state.stateful.emplace_back("powersgd." + reducer.name(), powersgd.get());  // the hook keeps it alive
  }
}

void Run::same_on_resume(const std::string& flag, const std::string& value, const std::string& before) {
  same_on_resume_.push_back({flag, value, before});
}

int64_t Run::start(const TrainData& data, const DataOptions& data_options) {
  return start(BatchStream(data, data_options, options.batch_size, static_cast<uint64_t>(options.seed), world, device));
}

int64_t Run::start(nd::data::Dataset dataset) {
  return start(BatchStream(std::move(dataset), options.batch_size, static_cast<uint64_t>(options.seed), world, device));
}

int64_t Run::start(BatchStream batches) {
  batches_.emplace(std::move(batches));
  const int64_t start = options.resume ? load_checkpoint(options, same_on_resume_, state, *batches_) : 0;
  log_.emplace(program, options, world, device, start);
  log_->watch(&scaler);
  return start;
}

std::optional<int> Run::end_of_step(int64_t step) {
  const CommonOptions& o = options;
  const BatchStream& batches = *batches_;
  Logger& log = *log_;
  state.step = step;
  const int signal = log.stop_signal();
  if (o.checkpoint_at(step) || signal != 0) {
    std::map<std::string, std::string> settings;
    for (const Setting& s : same_on_resume_) settings[s.flag] = s.value;
    save_checkpoint(o, world, state, batches, settings);
  }
  if (signal != 0 || step == o.exit_after || step == o.steps) report_skipped(program, batches, world, log);
  if (signal != 0) {
    log.finish();
    log.say(program + ": got " + signal_name(signal) + ": stopped after step " + std::to_string(step) + " of " +
            std::to_string(o.steps) + ", checkpoint " + checkpoint_path(o));
    log.say(program + ": to continue: " + resume_command(o, world));
    return 128 + signal;
  }
  if (step == o.exit_after) return 0;
  if (step == o.steps) log.stop_listening();
  return std::nullopt;
}

void Run::save_samples(int64_t step, const Image& image) {
  if (!world.rank0()) return;
  const CommonOptions& o = options;
  Logger& logger = *log_;
  char name[64];
  std::snprintf(name, sizeof name, "/samples_%06lld.png", static_cast<long long>(step));
  write_png(o.out + name, image);
  logger.say("wrote " + o.out + name);
  logger.add_image("samples", image, step);
}

double Optimized::step(const nd::Tensor& loss) {
  scaler->scale(loss).backward();
  update.before();
  scaler->step(*optimizer);
  return update.after();
}

void UpdateNorm::before() {
  nd::NoGradGuard no_grad;
  snapshot_.clear();
  for (const nd::Tensor& p : params_) snapshot_.push_back(p.detach().clone());
}

double UpdateNorm::after() {
  nd::NoGradGuard no_grad;
  double sq = 0;
  unchanged_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const nd::Tensor d = params_[i].detach() - snapshot_[i];
    const double s = d.mul(d).sum().item();
    sq += s;
    unchanged_ += s == 0;
  }
  return std::sqrt(sq);
}

std::unique_ptr<nd::optim::LRScheduler> warmup_cosine(nd::optim::Optimizer& optimizer, int64_t warmup, int64_t steps) {
  auto warm = std::make_shared<nd::optim::LinearLR>(optimizer, 0.01, 1.0, warmup);
  auto cosine = std::make_shared<nd::optim::CosineAnnealingLR>(optimizer, std::max<int64_t>(1, steps - warmup));
  return std::make_unique<nd::optim::SequentialLR>(optimizer, std::vector<std::shared_ptr<nd::optim::LRScheduler>>{warm, cosine},
                                                   std::vector<int64_t>{warmup});
}

int run_main(const std::string& program, const std::function<int()>& body) {
  nd::configure_threads();  // first: it may execute the program again (engine/threads.h)
  auto one_line = [](std::string s) {
    for (char& c : s)
      if (c == '\n') c = ' ';
    return s;
  };
  try {
    return body();
  } catch (const UsageError& e) {
    // Every rank checks the same command line: one message for the job, from rank 0.
    if (world().rank0())
      std::cerr << program << ": " << one_line(e.message) << " (run '" << program << " --help' for the options)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << one_line(e.what()) << "\n";
    // Under mpirun the other ranks may wait in a collective for this one (a file only this
    // rank read was corrupt), and MPI's finalisation would wait for them: end without it, so
    // that mpirun ends the job at once.
    if (world().size > 1) {
      std::cerr.flush();
      std::fflush(stdout);
      std::_Exit(1);
    }
    return 1;
  }
}

nd::Tensor map_chunks(const nd::Tensor& images, int64_t chunk, nd::Device device,
                      const std::function<nd::Tensor(const nd::Tensor&)>& fn) {
  nd::NoGradGuard no_grad;
  std::vector<nd::Tensor> parts;
  for (int64_t start = 0; start < images.size(0); start += chunk) {
    const int64_t len = std::min(chunk, images.size(0) - start);
    parts.push_back(fn(images.narrow(0, start, len).to(device)).cpu());
  }
  return nd::cat(parts, 0);
}

}  // namespace app
