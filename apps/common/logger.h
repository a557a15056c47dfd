#pragma once
// The run's outputs and its graceful stop: the progress bar on a terminal (plain lines
// otherwise), metrics.jsonl, TensorBoard event files, the loss-curve PNG, SIGINT and
// SIGTERM. Rank 0 writes every file; every rank runs the same collectives.
// Tests: tests/apps/apps_test.cpp, tests/apps/apps_runs_test.cpp, tests/apps/apps_kill_test.cpp.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nanoddp.h>

#include "common/options.h"
#include "common/png.h"

namespace app {

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
  // Opens the run's outputs for a run that starts after `start_step` (rank 0): creates DIR,
  // deletes the old run's files with --overwrite, keeps metrics.jsonl's lines up to
  // start_step, opens the TensorBoard event file.
  Logger(std::string program, const CommonOptions& options, const World& world, nd::Device device,
         int64_t start_step);
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

// "SIGINT", "SIGTERM" (what stop_signal() returns), "a signal" for another.
const char* signal_name(int signal);

}  // namespace app
