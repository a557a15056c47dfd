#include "common/train.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "io/json.h"

namespace app {

namespace fs = std::filesystem;

void add_common_flags(Flags& flags, CommonOptions& o, bool has_batch_norm) {
  o.flags = &flags;
  flags.add("--device", &o.device, "cpu or cuda (cuda:N)", "D");
  flags.add("--steps", &o.steps, "training steps (optimizer updates); 0 with --resume only evaluates", 0);
  flags.add("--batch-size", &o.batch_size, "global batch, split evenly over the ranks");
  flags.add("--lr", &o.lr, "learning rate");
  flags.add("--out", &o.out, "output folder: metrics.jsonl, PNGs, ckpt/ (default out/<app>)", "DIR");
  flags.add("--resume", &o.resume, "continue from DIR/ckpt/latest.safetensors");
  flags.add("--overwrite", &o.overwrite,
            "DIR holds a run (metrics.jsonl or ckpt/latest.safetensors): delete its files and start again");
  flags.add("--seed", &o.seed, "seed of the weights, the data order and the noise", 0);
  flags.add("--data", &o.data, "training data: a folder of Fashion-MNIST/MNIST IDX files (the default), and for the "
            "image apps an image folder (one subfolder per class) or CIFAR-10/100 binaries", "DIR");
  flags.add("--log-every", &o.log_every, "steps between log lines / metrics.jsonl entries");
  flags.add("--sample-every", &o.sample_every, "steps between sample PNGs");
  flags.add("--ckpt-every", &o.ckpt_every, "steps between checkpoints (one is also written at the end)");
  flags.add("--exit-after", &o.exit_after,
            "stop right after this step and its checkpoint, as if killed (tests --resume; 0: off)", 0);
  if (has_batch_norm) flags.add("--sync-bn", &o.sync_bn, "SyncBatchNorm: BatchNorm statistics over all ranks");
  flags.add("--amp", &o.amp,
            "mixed precision: bf16 operands, f32 accumulation in the GEMMs, convolutions and attention; "
            "on the CPU a slower reference");
  flags.add_choice("--amp-dtype", &o.amp_dtype, kAmpDtypes,
                   "--amp's operands: bf16 (default) or f16 (with loss scaling, a GradScaler)", "T");
  flags.add("--no-tensorboard", &o.no_tensorboard, "no TensorBoard event files in DIR (written by default)");
  flags.add_choice("--comm-hook", &o.comm_hook, kCommHooks,
                   "DDP gradient communication: none (f32 all-reduce), bf16, fp16, or powersgd (low-rank compression)",
                   "H");
  flags.add("--powersgd-rank", &o.powersgd_rank, "--comm-hook powersgd: rank of the gradient approximation", 1);
  flags.add("--zero", &o.zero,
            "ZeRO: shard each optimizer's state over the ranks (ZeroRedundancyOptimizer); the same training");
}

World world() {
  const auto pg = nd::dist::world();
  return World{pg->rank(), pg->size()};
}

namespace {
// --device D on this rank: D, where "cuda" is this rank's GPU (cuda:<local rank>).
nd::Device rank_device(const std::string& flag) {
  const nd::Device device(flag);
  return device.is_cuda() && flag == "cuda" ? nd::Device(nd::kCUDA, nd::dist::local_rank()) : device;
}
}  // namespace

nd::Device setup(const std::string& program, CommonOptions& o, const World& world) {
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
  int64_t taken = !o.resume && !o.overwrite && world.rank0() && holds_run(o.out);
  if (world.size > 1) {
    nd::Tensor flag = nd::full({1}, static_cast<double>(taken), nd::TensorOptions(nd::kInt64));
    nd::dist::world()->allreduce(flag, {nd::dist::ReduceOp::MAX})->wait();
    taken = flag.data_ptr<int64_t>()[0];
  }
  if (taken) {
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

bool holds_run(const std::string& dir) {
  return fs::exists(fs::path(dir) / "metrics.jsonl") || fs::exists(fs::path(dir) / "ckpt" / "latest.safetensors");
}

nd::ScalarType amp_dtype(const CommonOptions& o) {
  return o.amp_dtype == AmpDtype::kF16 ? nd::kFloat16 : nd::kBFloat16;
}

nd::optim::GradScalerOptions grad_scaler_options(const CommonOptions& o) {
  return nd::optim::GradScalerOptions().enabled(o.amp && amp_dtype(o) == nd::kFloat16);
}

nd::dist::DistributedDataParallelOptions ddp_options(nd::Device device) {
  return nd::dist::DistributedDataParallelOptions().process_group(nd::dist::default_group(device));
}

void register_comm_hook(nd::dist::Reducer& reducer, const CommonOptions& o, nd::TrainState& state) {
  namespace dist = nd::dist;
  if (o.comm_hook == CommHook::kBf16 || o.comm_hook == CommHook::kFp16) {
    auto hook = o.comm_hook == CommHook::kBf16 ? dist::bf16_compress_hook : dist::fp16_compress_hook;
    reducer.register_comm_hook([hook](dist::GradBucket& bucket) { return hook(nullptr, bucket); },
                               dist::comm_hook_name(hook));
  } else if (o.comm_hook == CommHook::kPowerSGD) {
    auto powersgd = std::make_shared<dist::PowerSGDState>(
        dist::PowerSGDOptions().matrix_approximation_rank(o.powersgd_rank).start_powerSGD_iter(o.steps / 10));
    reducer.register_comm_hook([powersgd](dist::GradBucket& bucket) { return dist::powerSGD_hook(powersgd.get(), bucket); },
                               dist::describe_comm_hook(powersgd.get(), dist::powerSGD_hook));
    state.stateful.push_back({"powersgd." + reducer.name(), powersgd.get()});  // the hook keeps it alive
  }
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

nd::Tensor shard_rows(const nd::Tensor& global, const World& world) {
  if (world.size == 1) return global;
  const int64_t n = global.size(0) / world.size;
  nd::Tensor idx = nd::empty({n}, nd::TensorOptions(nd::kInt64));
  for (int64_t i = 0; i < n; ++i) idx.data_ptr<int64_t>()[i] = i * world.size + world.rank;
  return global.index_select(0, idx.to(global.device()));
}

nd::data::DataLoaderOptions BatchStream::shard_options(int64_t n, int64_t global_batch, uint64_t seed,
                                                       const World& world, nd::Device device) {
  ND_CHECK(global_batch <= n, "--batch-size ", global_batch, " exceeds the ", n, " training images");
  nd::dist::DistributedSampler sampler(n, world.size, world.rank, /*shuffle=*/true, seed, /*drop_last=*/true);
  auto options = nd::data::DataLoaderOptions(global_batch / world.size).drop_last(true).seed(seed).sampler(
      [sampler](int64_t epoch) {
        auto s = sampler;
        s.set_epoch(static_cast<uint64_t>(epoch));
        return s.indices();
      });
  // On a GPU the loader's threads pin each batch, and next() copies it without waiting.
  if (device.is_cuda()) options.pin_memory(true).pin_memory_device(device);
  return options;
}

BatchStream::BatchStream(nd::data::Dataset dataset, int64_t global_batch, uint64_t seed, const World& world,
                         nd::Device device)
    : device_(device) {
  auto options = shard_options(dataset.labels.size(0), global_batch, seed, world, device);
  loader_ = std::make_unique<nd::data::DataLoader>(std::move(dataset), options);
  per_epoch_ = loader_->size();
}

BatchStream::BatchStream(const TrainData& data, const DataOptions& o, int64_t global_batch, uint64_t seed,
                         const World& world, nd::Device device)
    : device_(device) {
  auto options = shard_options(data.size(), global_batch, seed, world, device).num_workers(o.workers);
  if (data.is_idx()) {
    loader_ = std::make_unique<nd::data::DataLoader>(data.tensors, options);
  } else {
    loader_ = std::make_unique<nd::data::DataLoader>(data.images, options.skip_unreadable(o.skip_unreadable));
  }
  per_epoch_ = loader_->size();
}

nd::data::Batch BatchStream::next() {
  std::optional<nd::data::Batch> batch = loader_->next();
  if (!batch) batch = loader_->next();  // the end of an epoch: the next one starts
  ++consumed_;
  batch->images = batch->images.to(device_, /*non_blocking=*/true);
  batch->labels = batch->labels.to(device_, /*non_blocking=*/true);
  return std::move(*batch);
}

void BatchStream::seek(int64_t consumed) {
  loader_->seek(consumed / per_epoch_, consumed % per_epoch_);  // builds none of the batches before
  consumed_ = consumed;
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

namespace {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

// The "key":number pairs of one of our own metrics lines (strings and nulls skipped).
std::vector<std::pair<std::string, double>> parse_numbers(const std::string& line) {
  std::vector<std::pair<std::string, double>> out;
  size_t i = 0;
  while ((i = line.find('"', i)) != std::string::npos) {
    const size_t end = line.find('"', i + 1);
    if (end == std::string::npos || end + 1 >= line.size() || line[end + 1] != ':') break;
    const std::string key = line.substr(i + 1, end - i - 1);
    const char* start = line.c_str() + end + 2;
    char* stop = nullptr;
    const double v = std::strtod(start, &stop);
    if (stop != start) out.emplace_back(key, v);
    i = (stop != start ? static_cast<size_t>(stop - line.c_str()) : end + 2);
    if (i < line.size() && line[i] == '"') i = line.find('"', i + 1) + 1;  // a string value
  }
  return out;
}

// The files a run writes into `dir` (metrics.jsonl, loss_curve.png, samples_*.png, the
// event files, classifier.safetensors, ckpt/latest.safetensors and its temp files), removed
// by --overwrite, and ckpt/ when that leaves it empty; nothing else. Returns how many.
int remove_run(const fs::path& dir) {
  auto run_file = [](const std::string& name, bool in_ckpt) {
    auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
    auto ends = [&](const std::string& suffix) {
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (in_ckpt) return name == "latest.safetensors" || starts(".latest.safetensors.tmp.");
    return name == "metrics.jsonl" || name == "loss_curve.png" || name == "classifier.safetensors" ||
           (starts("samples_") && ends(".png")) || starts("events.out.tfevents.");
  };
  int removed = 0;
  for (const auto& [folder, in_ckpt] : {std::pair{dir, false}, std::pair{dir / "ckpt", true}}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(folder, ec)) {
      if (!entry.is_regular_file() || !run_file(entry.path().filename().string(), in_ckpt)) continue;
      std::error_code rm;
      fs::remove(entry.path(), rm);
      ND_CHECK(!rm, "--overwrite: cannot delete ", entry.path().string(), ": ", rm.message());
      ++removed;
    }
  }
  std::error_code ec;
  if (fs::is_empty(dir / "ckpt", ec) && !ec) fs::remove(dir / "ckpt", ec);
  return removed;
}

// Graceful stop: the first SIGINT or SIGTERM sets this; the handler puts back both
// signals' default action, so that a second one ends the process at once.
std::atomic<int> g_stop_signal{0};

extern "C" void record_stop_signal(int signal) {
  g_stop_signal.store(signal);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGINT, &dfl, nullptr);
  sigaction(SIGTERM, &dfl, nullptr);
}

void set_stop_handlers(bool on) {
  struct sigaction action {};
  action.sa_handler = on ? record_stop_signal : SIG_DFL;
  action.sa_flags = SA_RESTART;  // interrupted system calls (file writes, MPI's polls) go on
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

const char* signal_name(int signal) { return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal"; }

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

}  // namespace

Logger::Logger(std::string program, const CommonOptions& o, const World& world, int64_t start_step)
    : program_(std::move(program)), out_(o.out), device_(rank_device(o.device)), world_(world), total_(o.steps),
      log_every_(o.log_every),
      start_step_(start_step), terminal_(world.size == 1 && isatty(fileno(stdout)) != 0), started_(std::chrono::steady_clock::now()),
      last_draw_(started_) {
  if (!world_.rank0()) return;
  std::error_code ec;
  fs::create_directories(out_, ec);
  ND_CHECK(!ec, "cannot create the output folder ", out_, ": ", ec.message());
  if (o.overwrite) {
    const int removed = remove_run(out_);
    if (removed) say("--overwrite: deleted " + std::to_string(removed) + " file(s) of the previous run in " + out_);
  }
  say(program_ + ": " + nd::configure_threads().describe());
  // On resume keep the lines up to the checkpoint (and their losses for the curve);
  // lines a killed run wrote after it are dropped.
  const std::string path = out_ + "/metrics.jsonl";
  std::vector<std::string> kept;
  if (start_step > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto numbers = parse_numbers(line);
      if (numbers.empty() || numbers[0].first != "step" || numbers[0].second > static_cast<double>(start_step))
        continue;
      kept.push_back(line);
      for (const auto& [key, v] : numbers) {
        if (key.rfind("loss", 0) != 0) continue;
        auto it = std::find_if(curves_.begin(), curves_.end(), [&](const Series& s) { return s.name == key; });
        if (it == curves_.end()) it = curves_.insert(curves_.end(), Series{key, {}});
        it->points.emplace_back(numbers[0].second, v);
      }
    }
  }
  std::ofstream out(path, std::ios::trunc);
  for (const std::string& line : kept) out << line << "\n";
  ND_CHECK(out.good(), "cannot write ", path);
  if (o.no_tensorboard) return;
  // A resumed run adds a new event file next to the first one; TensorBoard merges them, and
  // purge_step (the first step this run takes) hides what a killed run logged after the
  // checkpoint, as metrics.jsonl's lines after start_step were dropped above.
  nd::tensorboard::SummaryWriterOptions options;
  if (o.resume) options.purge_step = start_step + 1;
  tensorboard_ = std::make_unique<nd::tensorboard::SummaryWriter>(out_, options);
  if (!o.run_flags.empty()) tensorboard_->add_text("flags", o.run_flags, start_step);
  tensorboard_->flush();
}

Logger::~Logger() {
  if (listening_) set_stop_handlers(false);
}

void Logger::stop_listening() {
  if (!listening_) return;
  set_stop_handlers(false);
  listening_ = false;
  if (const int signal = g_stop_signal.exchange(0)) raise(signal);  // came after the last step: its default effect
}

void Logger::print_line(const std::string& line, bool permanent) {
  if (!world_.rank0()) return;
  if (terminal_) {
    std::printf("\r\033[K%s%s", line.c_str(), permanent ? "\n" : "");
    bar_open_ = !permanent;
  } else if (permanent) {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void Logger::say(const std::string& text) {
  if (!world_.rank0()) return;
  if (terminal_ && bar_open_) std::printf("\r\033[K");
  std::printf("%s\n", text.c_str());
  bar_open_ = false;
  std::fflush(stdout);
}

void Logger::write_line(int64_t step, const Values& values, const std::map<std::string, std::string>& text) {
  if (!world_.rank0()) return;
  std::ostringstream line;
  line << "{\"step\":" << step;
  for (const auto& [k, v] : values) line << "," << nd::json::quoted(k) << ":" << json_number(v);
  for (const auto& [k, v] : text) line << "," << nd::json::quoted(k) << ":" << nd::json::quoted(v);
  line << "}\n";
  std::ofstream out(out_ + "/metrics.jsonl", std::ios::app);
  out << line.str();
  ND_CHECK(out.good(), "cannot write ", out_, "/metrics.jsonl");
  if (!tensorboard_) return;
  for (const auto& [k, v] : values) tensorboard_->add_scalar(k, v, step);
  for (const auto& [k, v] : text) tensorboard_->add_text(k, v, step);
  tensorboard_->flush();  // a log line is rare: TensorBoard sees it at once
}

void Logger::add_image(const std::string& tag, const Image& image, int64_t step) {
  if (!tensorboard_) return;
  tensorboard_->add_image(tag, image_tensor(image), step);
  tensorboard_->flush();
}

void Logger::step(int64_t step, const Values& losses, const Values& update_norms, const Values& other) {
  if (!listening_) {
    g_stop_signal.store(0);
    set_stop_handlers(true);
    listening_ = true;
  }
  // Every rank, every step: all stop after the same step when any got a signal.
  int64_t signal = g_stop_signal.load();
  if (world_.size > 1) {
    nd::Tensor flag = nd::full({1}, static_cast<double>(signal), nd::TensorOptions(nd::kInt64));
    nd::dist::world()->allreduce(flag, {nd::dist::ReduceOp::MAX})->wait();
    signal = flag.data_ptr<int64_t>()[0];
  }
  stop_signal_ = static_cast<int>(signal);
  if (window_sums_.empty()) {
    window_sums_.assign(losses.size(), 0.0);
    for (const auto& [k, v] : losses) loss_names_.push_back(k);
  }
  for (size_t i = 0; i < losses.size(); ++i) window_sums_[i] += losses[i].second;
  ++window_;
  const bool log_now = step % log_every_ == 0 || step == total_ || stop_signal_ != 0;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - started_).count();
  const double rate = static_cast<double>(step - start_step_) / std::max(elapsed, 1e-9);
  const double eta = static_cast<double>(total_ - step) / rate;
  Values shown = losses;  // on log steps: the window means
  if (log_now) {
    // Every rank joins this all-reduce: the logged loss is the mean over the global batch.
    nd::Tensor sums = nd::empty({static_cast<int64_t>(window_sums_.size())}, nd::TensorOptions(nd::kFloat64));
    for (size_t i = 0; i < window_sums_.size(); ++i) sums.data_ptr<double>()[i] = window_sums_[i];
    if (world_.size > 1 && !window_sums_.empty()) nd::dist::world()->allreduce(sums)->wait();
    Values values;
    for (size_t i = 0; i < window_sums_.size(); ++i) {
      const double mean = sums.data_ptr<double>()[i] / static_cast<double>(window_ * world_.size);
      values.emplace_back(loss_names_[i], mean);
      shown[i].second = mean;
      if (world_.rank0()) {
        auto it = std::find_if(curves_.begin(), curves_.end(), [&](const Series& s) { return s.name == loss_names_[i]; });
        if (it == curves_.end()) it = curves_.insert(curves_.end(), Series{loss_names_[i], {}});
        it->points.emplace_back(static_cast<double>(step), mean);
      }
    }
    if (window_ != log_every_) values.emplace_back("steps_averaged", static_cast<double>(window_));
    for (const auto& [k, v] : update_norms) values.emplace_back("update_norm_" + k, v);
    values.insert(values.end(), other.begin(), other.end());
    if (scaler_ && scaler_->is_enabled()) values.emplace_back("amp_scale", scaler_->get_scale());
    values.emplace_back("steps_per_s", rate);
    // cudaMalloc calls so far: constant after the first steps (the caching allocator's steady state).
    if (device_.is_cuda()) values.emplace_back("cuda_mallocs", double(nd::cuda::memory_stats(device_).num_mallocs));
    // The most tensor memory this rank's device held at once since the last log line
    // (max_memory_allocated): the dataset if it lives there, the models, their gradients
    // and optimizer state, and a step's activations.
    if (device_.is_cuda()) {
      values.emplace_back("peak_mem_bytes", double(nd::cuda::memory_stats(device_).peak_allocated_bytes));
      nd::cuda::reset_peak_memory_stats(device_);
    } else {
      values.emplace_back("peak_mem_bytes", double(nd::cpu::memory_stats().peak_allocated_bytes));
      nd::cpu::reset_peak_memory_stats();
    }
    if (tensorboard_)  // histograms only here: copying every parameter to the host each step would cost
      for (const auto& [name, module] : watched_)
        for (const auto& [param, p] : module->named_parameters()) tensorboard_->add_histogram(name + "/" + param, p, step);
    write_line(step, values, {});
    std::fill(window_sums_.begin(), window_sums_.end(), 0.0);
    window_ = 0;
  }
  if (!world_.rank0() || (!log_now && !terminal_)) return;
  if (!log_now && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  char buf[128];
  std::string line;
  const int width = std::to_string(total_).size();
  std::snprintf(buf, sizeof buf, "step %*lld/%lld", width, static_cast<long long>(step), static_cast<long long>(total_));
  line += buf;
  if (terminal_) {
    const int filled = total_ > 0 ? static_cast<int>(20 * step / total_) : 20;
    line += " [" + std::string(filled, '#') + std::string(20 - filled, '.') + "]";
  }
  for (const auto& [k, v] : shown) {
    std::snprintf(buf, sizeof buf, "  %s %.4f", k.c_str(), v);
    line += buf;
  }
  line += "  |update|";
  for (const auto& [k, v] : update_norms) {
    std::snprintf(buf, sizeof buf, " %s %.2e", k.c_str(), v);
    line += buf;
  }
  std::snprintf(buf, sizeof buf, "  %.2f steps/s  ETA %s", rate, duration(eta).c_str());
  line += buf;
  print_line(line, log_now && !terminal_);
}

void Logger::record(int64_t step, const Values& values, const std::map<std::string, std::string>& text) {
  write_line(step, values, text);
  std::string line = "step " + std::to_string(step) + ":";
  char buf[96];
  for (const auto& [k, v] : values) {
    std::snprintf(buf, sizeof buf, " %s %.6g", k.c_str(), v);
    line += buf;
  }
  for (const auto& [k, v] : text) line += " " + k + " " + v;
  say(line);
}

void Logger::finish() {
  if (!world_.rank0()) return;
  if (terminal_ && bar_open_) std::printf("\n");
  bar_open_ = false;
  if (!curves_.empty()) {
    write_png(out_ + "/loss_curve.png", plot_series(curves_));
    say("wrote " + out_ + "/loss_curve.png");
  }
}

std::string checkpoint_path(const CommonOptions& o) { return o.out + "/ckpt/latest.safetensors"; }

void save_checkpoint(const CommonOptions& o, const World& world, nd::TrainState& state, const BatchStream& batches) {
  const nd::TensorDict collected = nd::train_state_dict(state);  // every rank: PowerSGD gathers its errors
  if (!world.rank0()) return;
  std::error_code ec;
  fs::create_directories(fs::path(o.out) / "ckpt", ec);
  ND_CHECK(!ec, "cannot create the checkpoint folder ", o.out, "/ckpt: ", ec.message());
  nd::save_train_state(checkpoint_path(o), collected, state,
                       {{"batches_consumed", std::to_string(batches.consumed())},
                        {"epoch", std::to_string(batches.epoch())},
                        {"global_batch_size", std::to_string(o.batch_size)},
                        {"seed", std::to_string(o.seed)}},
                       world.size);
}

int64_t load_checkpoint(const CommonOptions& o, nd::TrainState& state, BatchStream& batches) {
  const std::string path = checkpoint_path(o);
  ND_CHECK(fs::exists(path), "--resume: no checkpoint at ", path, " (train without --resume first)");
  if (o.steps != 0) {
    const auto header = nd::load_metadata(path);
    const auto step = header.find("step");
    if (step != header.end() && std::stoll(step->second) >= o.steps)
      throw UsageError{"--resume: the checkpoint " + path + " is at step " + step->second + " and --steps is " +
                       std::to_string(o.steps) + ": nothing to train (give --steps above " + step->second +
                       ", or --steps 0 to only evaluate)"};
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

namespace {
// Every rank's files --skip-unreadable left out, one a line.
void report_skipped(const BatchStream& batches, const World& world, Logger& log) {
  const auto skipped = batches.skipped();
  if (skipped.empty()) return;
  std::string text = log.program() + ": --skip-unreadable: rank " + std::to_string(world.rank) + " left out " +
                     std::to_string(skipped.size()) + " unreadable file(s):";
  for (const auto& s : skipped) text += "\n  " + s.error;
  if (world.rank0()) log.say(text);
  else std::printf("%s\n", text.c_str());
}
}  // namespace

std::optional<int> end_of_step(const CommonOptions& o, const World& world, nd::TrainState& state,
                               const BatchStream& batches, Logger& log, int64_t step) {
  const int signal = log.stop_signal();
  if (o.checkpoint_at(step) || signal != 0) save_checkpoint(o, world, state, batches);
  if (signal != 0 || step == o.exit_after || step == o.steps) report_skipped(batches, world, log);
  if (signal != 0) {
    log.finish();
    log.say(log.program() + ": got " + signal_name(signal) + ": stopped after step " + std::to_string(step) + " of " +
            std::to_string(o.steps) + ", checkpoint " + checkpoint_path(o));
    log.say(log.program() + ": to continue: " + resume_command(o, world));
    return 128 + signal;
  }
  if (step == o.exit_after) return 0;
  if (step == o.steps) log.stop_listening();
  return std::nullopt;
}

void save_samples(Logger& logger, const World& world, const CommonOptions& o, int64_t step, const Image& image) {
  if (!world.rank0()) return;
  char name[64];
  std::snprintf(name, sizeof name, "/samples_%06lld.png", static_cast<long long>(step));
  write_png(o.out + name, image);
  logger.say("wrote " + o.out + name);
  logger.add_image("samples", image, step);
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
