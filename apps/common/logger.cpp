#include "common/logger.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/json.h"

namespace app {

namespace fs = std::filesystem;

const char* signal_name(int signal) { return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal"; }

namespace {

// The files a run writes into `dir` (metrics.jsonl, loss_curve.png, samples_*.png, the
// event files, classifier.safetensors, ckpt/latest.safetensors and its temp files), removed
// by --overwrite, and ckpt/ when that leaves it empty; nothing else. Returns how many.
int remove_run(const std::string& folder) {
  const fs::path dir(folder);
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
  for (const auto& [path, in_ckpt] : {std::pair{dir, false}, std::pair{dir / "ckpt", true}}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
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

}  // namespace

Logger::Logger(std::string program, const CommonOptions& o, const World& world, nd::Device device, int64_t start_step)
    : program_(std::move(program)), out_(o.out), device_(device), world_(world), total_(o.steps),
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
  if (o.flags) tensorboard_->add_text("flags", o.flags->values_markdown(), start_step);
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
  stop_signal_ = static_cast<int>(world_.max(g_stop_signal.load()));
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

}  // namespace app
