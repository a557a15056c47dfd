// SummaryWriter and the event-file reader (io/tensorboard.h, io/event_file.h):
// CRC-32C against RFC 3720's test vectors, every kind of summary written and read back
// value for value (PNGs inflated and compared pixel for pixel), add_scalars' sub-folders,
// a truncated last record skipped with a warning, a corrupt one an error naming file and
// offset; and when Python's tensorboard package is importable, its EventAccumulator
// reads what SummaryWriter wrote (SKIPPED otherwise).
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness.h"

using namespace nd;
using namespace nd::tensorboard;
using nd::testing::error_message;
using nd::testing::WarningCapture;
namespace fs = std::filesystem;

namespace {

// A fresh `name` folder under this process's scratch folder (removed at exit).
fs::path scratch_dir(const std::string& name) {
  struct Root {
    fs::path path = fs::temp_directory_path() / ("nanoddp_tensorboard_test_" + std::to_string(getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Root root;
  fs::remove_all(root.path / name);
  fs::create_directories(root.path / name);
  return root.path / name;
}

Tensor from_values(const std::vector<double>& values) { return nd::tensor(values, TensorOptions(kFloat64)); }

// The one event file in `dir`.
std::string event_file_in(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) found.push_back(entry.path().string());
  REQUIRE(found.size() == 1);
  return found[0];
}

// Where each record of an event file starts, from the framing alone (length at offset,
// 16 bytes of length, CRCs): the reader's view checked independently.
std::vector<uint64_t> record_offsets(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<uint64_t> offsets;
  for (uint64_t at = 0; at + 8 <= bytes.size();) {
    offsets.push_back(at);
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<uint8_t>(bytes[at + i]);
    at += 16 + length;
  }
  return offsets;
}

// PNG bytes -> {width, height, channels, pixels interleaved}: chunks, IHDR, inflated
// IDAT, filter bytes (all 0 from our encoder) stripped.
struct Decoded {
  uint32_t width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
};
Decoded decode_png(const std::string& png) {
  REQUIRE(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(png[at + i]);
    return v;
  };
  Decoded d;
  std::string idat;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t len = u32(at);
    const std::string type = png.substr(at + 4, 4);
    CHECK(crc32(0L, reinterpret_cast<const Bytef*>(png.data() + at + 4), len + 4) == u32(at + 8 + len));
    if (type == "IHDR") {
      d.width = u32(at + 8), d.height = u32(at + 12);
      const int color = png[at + 17];
      d.channels = color == 0 ? 1 : color == 2 ? 3 : color == 6 ? 4 : 0;
    }
    if (type == "IDAT") idat += png.substr(at + 8, len);
    at += 12 + len;
  }
  const size_t row = d.width * d.channels;
  std::vector<uint8_t> raw(d.height * (row + 1));
  uLongf size = raw.size();
  REQUIRE(uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) == Z_OK);
  REQUIRE(size == raw.size());
  for (uint32_t y = 0; y < d.height; ++y) {
    CHECK(raw[y * (row + 1)] == 0);
    d.pixels.insert(d.pixels.end(), raw.begin() + y * (row + 1) + 1, raw.begin() + (y + 1) * (row + 1));
  }
  return d;
}

// The one summary value of a summary event.
const Summary::Value& only_value(const Event& e) {
  REQUIRE(e.summary.has_value());
  REQUIRE(e.summary->value.size() == 1);
  return e.summary->value[0];
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C matches RFC 3720's test vectors and TFRecord's mask") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  CHECK(crc32c(ascending) == 0x46DD794Eu);
  CHECK(crc32c("6789", crc32c("12345")) == 0xE3069283u);  // continues a running CRC
  const uint32_t c = 0xE3069283u;
  CHECK(masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("tensorboard: every kind of summary reads back value for value") {
  const fs::path dir = scratch_dir("kinds");
  std::string path;
  {
    SummaryWriter w(dir.string());
    path = w.file_path();
    CHECK(fs::path(path).parent_path() == dir);
    CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
    w.add_scalar("loss/d", 0.25, 3, 1000.5);
    w.add_scalar("nan", std::nan(""), -2, 1001.0);
    w.add_histogram("w", from_values({-1, 0, 0, 0.5, 2, 2e-13}), 5, 1002.0);
    // u8 CHW, 3 channels, 2 rows, 4 columns: value = 100 c + 10 y + x.
    Tensor chw = nd::empty({3, 2, 4}, TensorOptions(kUInt8));
    for (int i = 0; i < 24; ++i)
      chw.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(100 * (i / 8) + 10 * (i / 4 % 2) + i % 4);
    w.add_image("img", chw, 6, 1003.0);
    // f32 HW in [0, 1] and beyond: times 255, clipped, truncated.
    w.add_image("gray", from_values({0, 0.5, 1, 2, -1, 0.999}).reshape({2, 3}), 7, 1004.0, "HW");
    w.add_text("flags", "| flag | value |\n|---|---|\n| --lr | 0.0002 |", 8, 1005.0);
  }
  const std::vector<Event> events = read_events(path);
  REQUIRE(events.size() == 7);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].wall_time > 1.6e9);
  CHECK_FALSE(events[0].summary.has_value());

  CHECK(events[1].wall_time == 1000.5);
  CHECK(events[1].step == 3);
  CHECK(only_value(events[1]).tag == "loss/d");
  CHECK(only_value(events[1]).simple_value == 0.25f);
  CHECK(events[2].step == -2);
  CHECK(std::isnan(*only_value(events[2]).simple_value));

  const HistogramProto& h = *only_value(events[3]).histo;
  CHECK(events[3].step == 5);
  CHECK(h.min == -1);
  CHECK(h.max == 2);
  CHECK(h.num == 6);
  CHECK(h.sum == doctest::Approx(1.5 + 2e-13));
  CHECK(h.sum_squares == doctest::Approx(5.25));
  REQUIRE(h.bucket.size() == h.bucket_limit.size());
  CHECK(h.bucket_limit.back() == DBL_MAX);  // the last (empty) run ends at DBL_MAX
  // Non-empty buckets hold exactly the values in [previous limit, limit); empty runs
  // are collapsed, so no two empty buckets follow each other.
  const std::vector<double> values = {-1, 0, 0, 0.5, 2, 2e-13};
  double total = 0;
  for (size_t i = 0; i < h.bucket.size(); ++i) {
    total += h.bucket[i];
    if (i > 0) CHECK_FALSE((h.bucket[i] == 0 && h.bucket[i - 1] == 0));
    if (h.bucket[i] == 0) continue;
    REQUIRE(i > 0);
    const double lo = h.bucket_limit[i - 1], hi = h.bucket_limit[i];
    CHECK(std::count_if(values.begin(), values.end(), [&](double v) { return lo <= v && v < hi; }) == h.bucket[i]);
    if (lo > 0) CHECK(hi / lo == doctest::Approx(1.1));
  }
  CHECK(total == 6);
  // 0 and 2e-13 share the bucket [0, 1e-12).
  const auto zero = std::find(h.bucket_limit.begin(), h.bucket_limit.end(), 1e-12);
  REQUIRE(zero != h.bucket_limit.end());
  CHECK(h.bucket[zero - h.bucket_limit.begin()] == 3);

  const Summary::Image& img = *only_value(events[4]).image;
  CHECK(only_value(events[4]).tag == "img");
  CHECK(img.height == 2);
  CHECK(img.width == 4);
  CHECK(img.colorspace == 3);
  const Decoded rgb = decode_png(img.encoded_image_string);
  CHECK(rgb.width == 4);
  CHECK(rgb.height == 2);
  REQUIRE(rgb.channels == 3);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) CHECK(rgb.pixels[(y * 4 + x) * 3 + c] == 100 * c + 10 * y + x);
  const Decoded gray = decode_png(only_value(events[5]).image->encoded_image_string);
  CHECK(only_value(events[5]).image->colorspace == 1);
  CHECK(gray.channels == 1);
  CHECK(gray.pixels == std::vector<uint8_t>{0, 127, 255, 255, 0, 254});

  const Summary::Value& text = only_value(events[6]);
  CHECK(text.tag == "flags/text_summary");
  CHECK(text.plugin_name == "text");
  CHECK(text.plugin_content.empty());
  REQUIRE(text.tensor.has_value());
  CHECK(text.tensor->dtype == kDtString);
  CHECK(text.tensor->tensor_shape == std::vector<int64_t>{1});
  CHECK(text.tensor->string_val == std::vector<std::string>{"| flag | value |\n|---|---|\n| --lr | 0.0002 |"});
}

TEST_CASE("tensorboard: add_scalars writes one file per entry under <main_tag>_<tag>, tagged main_tag") {
  const fs::path dir = scratch_dir("scalars");
  SummaryWriter w(dir.string());
  w.add_scalars("update/norm", {{"G", 0.5}, {"D", 0.125}}, 1);
  w.add_scalars("update/norm", {{"G", 0.25}, {"D", 0.0625}}, 2);
  w.close();
  for (const auto& [sub, first, second] :
       {std::tuple{"update_norm_G", 0.5f, 0.25f}, std::tuple{"update_norm_D", 0.125f, 0.0625f}}) {
    CAPTURE(sub);
    const std::vector<Event> events = read_events(event_file_in(dir / sub));
    REQUIRE(events.size() == 3);
    CHECK(only_value(events[1]).tag == "update/norm");
    CHECK(only_value(events[1]).simple_value == first);
    CHECK(events[2].step == 2);
    CHECK(only_value(events[2]).simple_value == second);
  }
  CHECK(read_events(w.file_path()).size() == 1);  // the main file: its file_version only
  CHECK_MESSAGE(error_message([&] { w.add_scalar("late", 1); }).find("after close()") != std::string::npos,
                "adding after close() is an error");
}

TEST_CASE("tensorboard: bad images and histograms are errors that name the tag") {
  SummaryWriter w(scratch_dir("bad").string());
  auto fails_with = [](const std::function<void()>& fn, const std::string& expected) {
    const std::string message = error_message(fn);
    CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
  };
  fails_with([&] { w.add_image("x", nd::zeros({2, 3, 3}), 0); },
             "add_image('x'): encode_png: expected 1, 3 or 4 channels, got 2");
  fails_with([&] { w.add_image("x", nd::zeros({3, 3}), 0); }, "dataformats CHW expects a 3-d tensor, got 2-d");
  fails_with([&] { w.add_image("x", nd::zeros({3, 3}), 0, std::nullopt, "NCHW"); },
             "expected dataformats CHW, HWC or HW, got 'NCHW'");
  fails_with([&] { w.add_histogram("h", from_values({std::nan("")}), 0); },
             "add_histogram('h'): make_histogram: expected finite values, got 1 values, 1 of them NaN or infinite");
  WarningCapture warnings;
  const HistogramProto h = make_histogram(from_values({1, INFINITY, std::nan("")}));
  CHECK(h.num == 1);
  REQUIRE(warnings.messages.size() == 1);
  CHECK(warnings.messages[0] == "make_histogram: 2 NaN or infinite values left out");
}

TEST_CASE("tensorboard: a truncated last record is skipped with a warning") {
  const fs::path dir = scratch_dir("truncated");
  std::string path;
  {
    SummaryWriter w(dir.string());
    path = w.file_path();
    for (int step = 1; step <= 3; ++step) w.add_scalar("loss", step * 0.5, step);
  }
  const auto full = fs::file_size(path);
  // A killed writer leaves any prefix of its last record: cut inside the data, inside
  // the final CRC and inside the 12-byte header.
  const uint64_t scalar_record = (full - record_offsets(path).back());
  for (const uint64_t cut : {uint64_t{1}, uint64_t{3}, scalar_record - 5}) {
    CAPTURE(cut);
    fs::copy_file(path, path + ".cut", fs::copy_options::overwrite_existing);
    fs::resize_file(path + ".cut", full - cut);
    WarningCapture warnings;
    const std::vector<Event> events = read_events(path + ".cut");
    REQUIRE(events.size() == 3);
    CHECK(only_value(events[2]).simple_value == 1.0f);
    REQUIRE(warnings.messages.size() == 1);
    CHECK(warnings.messages[0].find(path + ".cut: the last record, at offset " +
                                    std::to_string(record_offsets(path).back()) + ", is truncated") !=
          std::string::npos);
  }
}

TEST_CASE("tensorboard: a corrupt record is an error naming the file and the offset") {
  const fs::path dir = scratch_dir("corrupt");
  std::string path;
  {
    SummaryWriter w(dir.string());
    path = w.file_path();
    w.add_scalar("a", 1, 1);
    w.add_scalar("b", 2, 2);
  }
  const std::vector<uint64_t> at = record_offsets(path);
  REQUIRE(at.size() == 3);
  auto flip = [&](uint64_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    const char c = static_cast<char>(f.get() ^ 0x40);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(c);
  };
  flip(at[1] + 14);  // a byte of the second record's data
  std::string message = error_message([&] { read_events(path); });
  CHECK_MESSAGE(message.find(path + ": corrupt record at offset " + std::to_string(at[1]) +
                             ": the data's masked CRC-32C is 0x") != std::string::npos,
                message);
  flip(at[1] + 14);
  CHECK(read_events(path).size() == 3);
  flip(at[1] + 2);  // its length
  message = error_message([&] { read_events(path); });
  CHECK_MESSAGE(message.find(path + ": corrupt record at offset " + std::to_string(at[1]) +
                             ": the length's masked CRC-32C") != std::string::npos,
                message);
  CHECK(error_message([&] { read_events((dir / "none").string()); }) ==
        "read_events: cannot open " + (dir / "none").string());
}

TEST_CASE("tensorboard: Python's tensorboard reads the scalars, histograms, images and text") {
  if (std::system("python3 -c 'import tensorboard' >/dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED: Python's tensorboard package is not installed (pip install tensorboard)");
    return;
  }
  const fs::path dir = scratch_dir("python");
  {
    SummaryWriter w(dir.string());
    w.add_scalar("loss", 0.75, 1);
    w.add_scalar("loss", 0.5, 2);
    w.add_scalars("norm", {{"G", 0.125}}, 2);
    w.add_histogram("w", from_values({-3, -0.25, 0, 0, 1, 1, 1, 40}), 2);
    w.add_image("samples", nd::zeros({1, 5, 7}), 2);
    w.add_text("flags", "--lr 0.0002", 0);
  }
  // EventAccumulator keeps everything with size guidance 0; one line per value read.
  const fs::path script = dir / "read.py";
  std::ofstream(script) << R"(import sys
from tensorboard.backend.event_processing import event_accumulator as ea
def load(path):
    acc = ea.EventAccumulator(path, size_guidance={k: 0 for k in (ea.SCALARS, ea.HISTOGRAMS, ea.IMAGES, ea.TENSORS)})
    acc.Reload()
    return acc
acc = load(sys.argv[1])
for e in acc.Scalars("loss"): print("scalar", e.step, e.value)
for e in load(sys.argv[1] + "/norm_G").Scalars("norm"): print("scalars", e.step, e.value)
for e in acc.Histograms("w"):
    h = e.histogram_value
    print("histogram", e.step, h.min, h.max, h.num, h.sum, h.sum_squares, " ".join(str(c) for c in h.bucket if c))
for e in acc.Images("samples"): print("image", e.step, e.width, e.height, len(e.encoded_image_string))
print("text_plugin", " ".join(acc.PluginTagToContent("text")))
for e in acc.Tensors("flags/text_summary"): print("text", e.step, e.tensor_proto.string_val[0].decode())
)";
  const fs::path out = dir / "read.txt";
  const int rc =
      std::system(("python3 " + script.string() + " " + dir.string() + " > " + out.string() + " 2>&1").c_str());
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(text);
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  const std::string png = nd::encode_png(nd::zeros({1, 5, 7}, TensorOptions(kUInt8)));
  CHECK(text ==
        "scalar 1 0.75\n"
        "scalar 2 0.5\n"
        "scalars 2 0.125\n"
        "histogram 2 -3.0 40.0 8.0 39.75 1612.0625 1.0 1.0 2.0 3.0 1.0\n"
        "image 2 7 5 " +
            std::to_string(png.size()) +
            "\n"
            "text_plugin flags/text_summary\n"
            "text 0 --lr 0.0002\n");
}
