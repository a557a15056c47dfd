#pragma once
// SummaryWriter: TensorBoard logging as torch.utils.tensorboard.SummaryWriter does it,
// for the apps and for users' own binaries. It writes event files (io/event_file.h)
// that `tensorboard --logdir DIR` shows: scalars, groups of scalars, images (PNG),
// histograms and markdown text. Needs nothing from autograd: values are read from
// detached tensors. Tests: tests/tensorboard/tensorboard_test.cpp.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "io/event_file.h"
#include "engine/tensor.h"

namespace nd::tensorboard {

struct SummaryWriterOptions {
  int64_t max_queue = 10;   // events held in memory before they are flushed to disk
  double flush_secs = 120;  // and at the latest this long after the last flush
  // A run resumed from a checkpoint at step N passes N (PyTorch's purge_step): TensorBoard
  // then hides the events with step >= N that the earlier run wrote to the same log_dir.
  std::optional<int64_t> purge_step{};
};

// The histogram TensorBoard's C++ writer (tsl/lib/histogram) would make of `values`
// (any dtype, device and layout): its default buckets, limits +-1e-12 * 1.1^k up to 1e20
// and a middle limit 0, bucket i counting the values v with limit[i-1] <= v < limit[i];
// each run of empty buckets is collapsed into one. Non-finite values are left out (with
// a warning). Throws nd::Error when no finite value is left.
HistogramProto make_histogram(const Tensor& values);

// Names and arguments as PyTorch's. global_step defaults to 0 and walltime to now
// (seconds since the epoch). Events are written by the calling thread; each method
// throws nd::Error when its input or the file is bad.
class SummaryWriter {
 public:
  // log_dir empty: runs/<Mon DD_HH-MM-SS>_<hostname>, PyTorch's default. Creates the folder
  // and its event file (events.out.tfevents.<time>.<host>.<pid>.<n>) at once. With
  // purge_step N, the file starts as torch.utils.tensorboard's does: after the file_version
  // event, a second one at step N and a SessionLog START at step N (written at once), which
  // TensorBoard's loader takes as "restarted at N" and drops what it read with step >= N.
  // add_scalars' sub-folders get no purge event (nor do PyTorch's).
  explicit SummaryWriter(std::string log_dir = "", SummaryWriterOptions options = {});
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  void add_scalar(const std::string& tag, double scalar_value, int64_t global_step = 0,
                  std::optional<double> walltime = std::nullopt);
  // One scalar per entry, each in its own event file under log_dir/<main_tag>_<tag>
  // ('/' in main_tag becomes '_'), tagged main_tag: TensorBoard draws them in one chart.
  void add_scalars(const std::string& main_tag, const std::map<std::string, double>& tag_scalar_dict,
                   int64_t global_step = 0, std::optional<double> walltime = std::nullopt);
  // PyTorch's bins="tensorflow" (make_histogram); other binnings are not offered.
  void add_histogram(const std::string& tag, const Tensor& values, int64_t global_step = 0,
                     std::optional<double> walltime = std::nullopt);
  // img_tensor: u8 (as is) or floating point in [0, 1] (times 255, clipped, truncated as
  // PyTorch does), laid out as dataformats says: "CHW", "HWC" or "HW"; 1, 3 or 4 channels.
  void add_image(const std::string& tag, const Tensor& img_tensor, int64_t global_step = 0,
                 std::optional<double> walltime = std::nullopt, const std::string& dataformats = "CHW");
  // Markdown for the text plugin, under the tag "<tag>/text_summary" as PyTorch writes it.
  void add_text(const std::string& tag, const std::string& text_string, int64_t global_step = 0,
                std::optional<double> walltime = std::nullopt);

  const std::string& get_logdir() const { return log_dir_; }
  // The main event file (add_scalars' files sit in sub-folders).
  const std::string& file_path() const { return writer_->path(); }
  void flush();
  // Flushes and closes every file; adding afterwards is an nd::Error.
  void close();

 private:
  void add(EventFileWriter& writer, Summary::Value value, int64_t global_step, std::optional<double> walltime);

  std::string log_dir_;
  SummaryWriterOptions options_;
  std::unique_ptr<EventFileWriter> writer_;
  std::map<std::string, std::unique_ptr<EventFileWriter>> scalars_writers_;  // add_scalars' by sub-folder
  int64_t pending_ = 0;
  std::chrono::steady_clock::time_point last_flush_;
  bool closed_ = false;
};

}  // namespace nd::tensorboard
