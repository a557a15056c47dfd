#include "io/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <ctime>

#include "engine/error.h"
#include "engine/factories.h"
#include "io/png.h"

namespace nd::tensorboard {

namespace {

// tsl/lib/histogram's default limits: -DBL_MAX, -1e20.., .., -1e-12, 0, 1e-12, .., 1e20.., DBL_MAX
// (each 1.1 times the last: 1548 limits).
const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) positive.push_back(v);
    positive.push_back(DBL_MAX);
    std::vector<double> all;
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return limits;
}

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string default_log_dir() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  char stamp[64];
  std::strftime(stamp, sizeof stamp, "%b%d_%H-%M-%S", &local);
  return std::string("runs/") + stamp + "_" + host;
}

}  // namespace

HistogramProto make_histogram(const Tensor& values) {
  const Tensor flat = values.detach().cpu().to(kFloat64).contiguous();
  const double* p = flat.data_ptr<double>();
  const std::vector<double>& limits = default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  HistogramProto h;
  h.min = DBL_MAX, h.max = -DBL_MAX;
  int64_t non_finite = 0;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const double v = p[i];
    if (!std::isfinite(v)) {
      ++non_finite;
      continue;
    }
    counts[static_cast<size_t>(std::upper_bound(limits.begin(), limits.end(), v) - limits.begin())] += 1;
    h.min = std::min(h.min, v), h.max = std::max(h.max, v);
    h.num += 1, h.sum += v, h.sum_squares += v * v;
  }
  ND_CHECK(h.num > 0, "make_histogram: expected finite values, got ", flat.numel(), " values, ", non_finite,
           " of them NaN or infinite");
  if (non_finite) warn("make_histogram: " + std::to_string(non_finite) + " NaN or infinite values left out");
  // As tsl's EncodeToProto: a run of empty buckets becomes one bucket ending at the run's last limit.
  for (size_t i = 0; i < counts.size();) {
    double end = limits[i], count = counts[i++];
    if (count == 0)
      while (i < counts.size() && counts[i] == 0) end = limits[i++];
    h.bucket_limit.push_back(end);
    h.bucket.push_back(count);
  }
  return h;
}

namespace {

// Checked before the event file is created, so a bad option leaves no empty file behind.
const SummaryWriterOptions& checked(const SummaryWriterOptions& options) {
  ND_CHECK(options.max_queue >= 1 && options.flush_secs > 0,
           "SummaryWriter: expected max_queue >= 1 and flush_secs > 0, got ", options.max_queue, " and ",
           options.flush_secs);
  ND_CHECK(!options.purge_step || *options.purge_step >= 0, "SummaryWriter: expected purge_step >= 0, got ",
           options.purge_step.value_or(0));
  return options;
}

}  // namespace

SummaryWriter::SummaryWriter(std::string log_dir, SummaryWriterOptions options)
    : log_dir_(log_dir.empty() ? default_log_dir() : std::move(log_dir)),
      options_(checked(options)),
      writer_(std::make_unique<EventFileWriter>(log_dir_)),
      last_flush_(std::chrono::steady_clock::now()) {
  if (!options.purge_step) return;
  Event version;
  version.wall_time = now();
  version.step = *options.purge_step;
  version.file_version = "brain.Event:2";
  Event start = version;
  start.file_version.clear();
  start.session_log = SessionLog{SessionLog::START};
  writer_->add_event(version);
  writer_->add_event(start);
  writer_->flush();  // a run killed again soon after still hides the stale steps
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (const Error& e) {
    warn(e.what());
  }
}

void SummaryWriter::add(EventFileWriter& writer, Summary::Value value, int64_t global_step,
                        std::optional<double> walltime) {
  ND_CHECK(!closed_, "SummaryWriter: '", value.tag, "' added after close() (", log_dir_, ")");
  Event event;
  event.wall_time = walltime.value_or(now());
  event.step = global_step;
  event.summary.emplace().value.push_back(std::move(value));
  writer.add_event(event);
  // PyTorch's queue: at most max_queue events, or flush_secs, between a record and the disk.
  if (++pending_ >= options_.max_queue ||
      std::chrono::steady_clock::now() - last_flush_ >= std::chrono::duration<double>(options_.flush_secs))
    flush();
}

void SummaryWriter::add_scalar(const std::string& tag, double scalar_value, int64_t global_step,
                               std::optional<double> walltime) {
  Summary::Value v;
  v.tag = tag;
  v.simple_value = static_cast<float>(scalar_value);
  add(*writer_, std::move(v), global_step, walltime);
}

void SummaryWriter::add_scalars(const std::string& main_tag, const std::map<std::string, double>& tag_scalar_dict,
                                int64_t global_step, std::optional<double> walltime) {
  std::string folder = main_tag;
  std::replace(folder.begin(), folder.end(), '/', '_');
  for (const auto& [tag, value] : tag_scalar_dict) {
    const std::string dir = log_dir_ + "/" + folder + "_" + tag;
    std::unique_ptr<EventFileWriter>& writer = scalars_writers_[dir];
    if (!writer) {
      ND_CHECK(!closed_, "SummaryWriter: '", main_tag, "' added after close() (", log_dir_, ")");
      writer = std::make_unique<EventFileWriter>(dir);
    }
    Summary::Value v;
    v.tag = main_tag;
    v.simple_value = static_cast<float>(value);
    add(*writer, std::move(v), global_step, walltime);
  }
}

void SummaryWriter::add_histogram(const std::string& tag, const Tensor& values, int64_t global_step,
                                  std::optional<double> walltime) {
  Summary::Value v;
  v.tag = tag;
  try {
    v.histo = make_histogram(values);
  } catch (const Error& e) {
    throw Error("SummaryWriter::add_histogram('" + tag + "'): " + e.what());
  }
  add(*writer_, std::move(v), global_step, walltime);
}

void SummaryWriter::add_image(const std::string& tag, const Tensor& img_tensor, int64_t global_step,
                              std::optional<double> walltime, const std::string& dataformats) {
  const std::string where = "SummaryWriter::add_image('" + tag + "'): ";
  ND_CHECK(dataformats == "CHW" || dataformats == "HWC" || dataformats == "HW", where,
           "expected dataformats CHW, HWC or HW, got '", dataformats, "'");
  ND_CHECK(img_tensor.dim() == static_cast<int64_t>(dataformats.size()), where, "dataformats ", dataformats,
           " expects a ", dataformats.size(), "-d tensor, got ", img_tensor.dim(), "-d");
  Tensor chw = img_tensor.detach().cpu();
  if (dataformats == "HW") chw = chw.unsqueeze(0);
  if (dataformats == "HWC") chw = chw.permute({2, 0, 1});
  if (chw.dtype() != kUInt8) {
    ND_CHECK(chw.is_floating_point(), where, "expected a u8 or floating-point image, got ", dtype_name(chw.dtype()));
    // PyTorch: (x * 255).clip(0, 255).astype(uint8), which truncates.
    const Tensor f = chw.to(kFloat32).contiguous();
    Tensor u8 = nd::empty(f.sizes(), TensorOptions(kUInt8));
    const float* src = f.data_ptr<float>();
    uint8_t* dst = u8.data_ptr<uint8_t>();
    for (int64_t i = 0; i < f.numel(); ++i) {
      const float x = src[i] * 255.0f;
      dst[i] = static_cast<uint8_t>(x >= 255.0f ? 255.0f : x > 0.0f ? x : 0.0f);  // NaN -> 0
    }
    chw = u8;
  }
  Summary::Image image;
  try {
    image.encoded_image_string = encode_png(chw);
  } catch (const Error& e) {
    throw Error(where + e.what());
  }
  image.colorspace = static_cast<int>(chw.size(0));
  image.height = static_cast<int>(chw.size(1));
  image.width = static_cast<int>(chw.size(2));
  Summary::Value v;
  v.tag = tag;
  v.image = std::move(image);
  add(*writer_, std::move(v), global_step, walltime);
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text_string, int64_t global_step,
                             std::optional<double> walltime) {
  Summary::Value v;
  v.tag = tag + "/text_summary";
  v.plugin_name = "text";  // content: TextPluginData{version = 0}, which serializes to no bytes
  v.tensor = TensorProto{kDtString, {1}, {text_string}};
  add(*writer_, std::move(v), global_step, walltime);
}

void SummaryWriter::flush() {
  if (closed_) return;
  writer_->flush();
  for (auto& [dir, writer] : scalars_writers_) writer->flush();
  pending_ = 0;
  last_flush_ = std::chrono::steady_clock::now();
}

void SummaryWriter::close() {
  if (closed_) return;
  closed_ = true;
  writer_->close();
  for (auto& [dir, writer] : scalars_writers_) writer->close();
}

}  // namespace nd::tensorboard
