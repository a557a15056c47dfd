// IDX reader and Fashion-MNIST loader: small valid and corrupt files (gzip and plain)
// written here, every error message, and the real dataset when it is installed.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "data/data.h"
#include "data_test_util.h"

using namespace nd;
namespace fs = std::filesystem;

namespace {

void put_u32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

// An IDX file: magic, big-endian sizes, then `data` (which may disagree with the sizes).
Bytes idx(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& data) {
  Bytes b;
  put_u32(b, magic);
  for (uint32_t d : dims) put_u32(b, d);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes iota_bytes(size_t n, unsigned start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((start + i) % 256);
  return b;
}

void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!b.empty()) REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
std::string quoted(const std::string& path) { return std::string("'") + path + "'"; }

// Smallest and largest value of a contiguous f32 tensor.
std::pair<float, float> min_max(const Tensor& t) {
  const float* p = t.data_ptr<float>();
  const auto [lo, hi] = std::minmax_element(p, p + t.numel());
  return {*lo, *hi};
}

// Writes a split of n images (pixel i of image k = (k + i) % 256) and labels k % 10.
void write_split(const TempDir& dir, const std::string& split, uint32_t n_images, uint32_t n_labels) {
  write_gz(dir.file(split + "-images-idx3-ubyte.gz"), idx(0x803, {n_images, 28, 28}, iota_bytes(n_images * 784)));
  Bytes labels(n_labels);
  for (uint32_t k = 0; k < n_labels; ++k) labels[k] = static_cast<unsigned char>(k % 10);
  write_gz(dir.file(split + "-labels-idx1-ubyte.gz"), idx(0x801, {n_labels}, labels));
}

}  // namespace

TEST_CASE("read_idx: plain and gzip files give the same u8 tensor of the file's shape") {
  TempDir dir;
  const Bytes file = idx(0x803, {2, 3, 4}, iota_bytes(24, 250));
  write_bytes(dir.file("images"), file);
  write_gz(dir.file("images.gz"), file);
  for (const std::string name : {"images", "images.gz"}) {
    CAPTURE(name);
    Tensor t = data::read_idx(dir.file(name));
    CHECK(t.dtype() == kUInt8);
    CHECK(t.sizes() == Shape{2, 3, 4});
    std::vector<double> expected;
    for (int i = 0; i < 24; ++i) expected.push_back((250 + i) % 256);
    nd::testing::check_close(t, expected, 0, 0, "pixels");
  }
  write_gz(dir.file("labels.gz"), idx(0x801, {5}, {3, 1, 4, 1, 5}));
  Tensor labels = data::read_idx(dir.file("labels.gz"));
  CHECK(labels.sizes() == Shape{5});
  nd::testing::check_close(labels, {3, 1, 4, 1, 5}, 0, 0, "labels");
  write_bytes(dir.file("empty_labels"), idx(0x801, {0}, {}));
  CHECK(data::read_idx(dir.file("empty_labels")).sizes() == Shape{0});
}

TEST_CASE("read_idx: every malformed file is an error naming the file, expected and found") {
  TempDir dir;
  const std::string missing = dir.file("no-such-file.gz");
  std::string msg = error_message([&] { data::read_idx(missing); });
  CHECK(contains(msg, "cannot open '" + missing + "'"));
  CHECK(contains(msg, "No such file or directory"));
  msg = error_message([&] { data::read_idx(dir.path.string()); });
  CHECK(contains(msg, "cannot open '" + dir.path.string() + "': it is a directory; expected an IDX file"));

  struct Bad {
    std::string name;
    Bytes bytes;
    std::vector<std::string> parts;  // substrings the message must contain
  };
  const Bytes good = idx(0x803, {2, 28, 28}, iota_bytes(2 * 784));
  const std::vector<Bad> cases = {
      {"empty", {}, {"is truncated: expected a 4-byte IDX magic number, found 0 bytes"}},
      {"short magic", {0, 0, 8}, {"expected a 4-byte IDX magic number, found 3 bytes"}},
      {"wrong magic", idx(0x12345678, {}, iota_bytes(8)),
       {"is not an IDX file: magic number 0x12345678, expected 0x00000801 (labels) or 0x00000803 (images)"}},
      {"png", {0x89, 'P', 'N', 'G', 13, 10, 26, 10}, {"is not an IDX file: magic number 0x89504e47"}},
      {"float type", idx(0x0D03, {1, 1, 1}, iota_bytes(4)),
       {"magic number 0x00000d03: element type 0x0d is not supported, expected 0x08"}},
      {"zero dims", idx(0x800, {}, {}), {"magic number 0x00000800: 0 dimensions, expected 1 to 4"}},
      {"five dims", idx(0x805, {1, 1, 1, 1, 1}, {7}), {"5 dimensions, expected 1 to 4"}},
      {"cut header", Bytes(good.begin(), good.begin() + 10),
       {"is truncated: magic number 0x00000803 announces 3 dimension sizes (12 bytes), found 6 bytes"}},
      {"cut data", Bytes(good.begin(), good.end() - 100),
       {"is truncated: its header says shape [2, 28, 28] = 1568 data bytes, found 1468"}},
      {"trailing data", idx(0x801, {3}, {1, 2, 3, 4}),
       {"has trailing data: its header says shape [3] = 3 data bytes, found 4"}},
      {"huge header", idx(0x803, {0xffffffff, 0xffffffff, 0xffffffff}, {}),
       {"is corrupt: its header promises more than 68719476736 bytes of data"}},
  };
  for (const Bad& c : cases) {
    for (const bool gz : {false, true}) {
      const std::string path = dir.file(c.name + (gz ? ".gz" : ""));
      CAPTURE(path);
      if (gz)
        write_gz(path, c.bytes);
      else
        write_bytes(path, c.bytes);
      msg = error_message([&] { data::read_idx(path); });
      CHECK(contains(msg, "read_idx: '" + path + "'"));
      for (const std::string& part : c.parts) CHECK_MESSAGE(contains(msg, part), msg);
    }
  }
}

TEST_CASE("read_idx: a cut-off or damaged gzip stream is an error, not silently short data") {
  TempDir dir;
  const std::string whole = dir.file("whole.gz");
  write_gz(whole, idx(0x803, {4, 28, 28}, iota_bytes(4 * 784)));
  const Bytes gz = data::read_file(whole);

  const std::string cut = dir.file("cut.gz");
  write_bytes(cut, Bytes(gz.begin(), gz.begin() + static_cast<ptrdiff_t>(gz.size() / 2)));
  std::string msg = error_message([&] { data::read_idx(cut); });
  CHECK(contains(msg, "read_idx: '" + cut + "' is truncated or corrupt: zlib reports"));

  // Every data byte is there, only the 8-byte gzip trailer (CRC-32, size) is missing.
  const std::string no_trailer = dir.file("no_trailer.gz");
  write_bytes(no_trailer, Bytes(gz.begin(), gz.end() - 8));
  msg = error_message([&] { data::read_idx(no_trailer); });
  CHECK(contains(msg, "read_idx: '" + no_trailer + "' is truncated or corrupt: zlib reports \"unexpected end of file\""));

  Bytes damaged = gz;
  damaged[damaged.size() - 6] ^= 0xff;  // inside the CRC-32 trailer
  const std::string bad = dir.file("damaged.gz");
  write_bytes(bad, damaged);
  msg = error_message([&] { data::read_idx(bad); });
  CHECK(contains(msg, "read_idx: '" + bad + "' is truncated or corrupt: zlib reports \"incorrect data check\""));
}

TEST_CASE("load_fashion_mnist: images in [-1, 1], labels i64, both splits") {
  TempDir dir;
  write_split(dir, "train", 3, 3);
  write_split(dir, "t10k", 2, 2);
  data::Dataset train = data::load_fashion_mnist(dir.path.string(), true);
  CHECK(train.images.sizes() == Shape{3, 1, 28, 28});
  CHECK(train.images.dtype() == kFloat32);
  CHECK(train.labels.sizes() == Shape{3});
  CHECK(train.labels.dtype() == kInt64);
  nd::testing::check_close(train.labels, {0, 1, 2}, 0, 0, "labels");
  // image 0: pixel i = i % 256, so pixel 0 -> -1, pixel 255 -> +1, pixel 128 -> 128/127.5 - 1.
  const float* x = train.images.data_ptr<float>();
  CHECK(x[0] == -1.0f);
  CHECK(x[255] == 1.0f);
  CHECK(x[128] == doctest::Approx(128 / 127.5 - 1).epsilon(1e-6));
  CHECK(min_max(train.images) == std::pair{-1.0f, 1.0f});
  CHECK(data::load_fashion_mnist(dir.path.string(), false).images.size(0) == 2);

  // Unzipped copies are found when the .gz files are absent.
  TempDir plain;
  for (const std::string stem : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}) {
    gzFile in = gzopen(dir.file(stem + ".gz").c_str(), "rb");
    Bytes b(4 * 1024 * 1024);
    const int n = gzread(in, b.data(), static_cast<unsigned>(b.size()));
    gzclose(in);
    b.resize(static_cast<size_t>(n));
    write_bytes((plain.path / stem).string(), b);
  }
  CHECK(data::load_fashion_mnist(plain.path.string(), true).labels.size(0) == 3);
}

TEST_CASE("load_fashion_mnist: missing files, wrong shapes, count mismatch and bad labels") {
  TempDir dir;
  std::string msg = error_message([&] { data::load_fashion_mnist(dir.path.string(), true); });
  CHECK(contains(msg, quoted(dir.file("train-images-idx3-ubyte.gz")) + " not found"));
  CHECK(contains(msg, "dataset-fashion-mnist"));

  write_split(dir, "train", 4, 3);
  msg = error_message([&] { data::load_fashion_mnist(dir.path.string(), true); });
  CHECK(contains(msg, quoted(dir.file("train-images-idx3-ubyte.gz")) + " holds 4 images but " +
                          quoted(dir.file("train-labels-idx1-ubyte.gz")) + " holds 3 labels; expected the same count"));

  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx(0x803, {3, 32, 32}, iota_bytes(3 * 1024)));
  msg = error_message([&] { data::load_fashion_mnist(dir.path.string(), true); });
  CHECK(contains(msg, "holds shape [3, 32, 32], expected images of shape [N, 28, 28] (magic 0x00000803)"));

  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx(0x803, {3, 28, 28}, iota_bytes(3 * 784)));
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx(0x803, {3, 1, 1}, {1, 2, 3}));
  msg = error_message([&] { data::load_fashion_mnist(dir.path.string(), true); });
  CHECK(contains(msg, quoted(dir.file("train-labels-idx1-ubyte.gz")) +
                          " holds shape [3, 1, 1], expected labels of shape [N] (magic 0x00000801)"));

  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx(0x801, {3}, {1, 12, 3}));
  msg = error_message([&] { data::load_fashion_mnist(dir.path.string(), true); });
  CHECK(contains(msg, "has label 12 at index 1, expected a class index in [0, 10)"));

  write_bytes(dir.file("train-labels-idx1-ubyte.gz"), idx(0x801, {3}, {1, 2}));
  msg = error_message([&] { data::load_fashion_mnist(dir.path.string(), true); });
  CHECK(contains(msg, std::string("read_idx: ") + quoted(dir.file("train-labels-idx1-ubyte.gz")) + " is truncated"));
}

TEST_CASE("load_fashion_mnist: the installed dataset (Debian dataset-fashion-mnist)") {
  if (!fs::exists(fs::path(data::kFashionMnistDir) / "train-images-idx3-ubyte.gz")) {
    MESSAGE("SKIPPED: " << data::kFashionMnistDir
                        << " not found (apt-get install dataset-fashion-mnist to run this test)");
    return;
  }
  data::Dataset train = data::load_fashion_mnist(data::kFashionMnistDir, true);
  data::Dataset test = data::load_fashion_mnist(data::kFashionMnistDir, false);
  CHECK(train.images.sizes() == Shape{60000, 1, 28, 28});
  CHECK(train.labels.sizes() == Shape{60000});
  CHECK(test.images.sizes() == Shape{10000, 1, 28, 28});
  CHECK(test.labels.sizes() == Shape{10000});
  // The first labels of each split, as published with the dataset.
  nd::testing::check_close(train.labels.slice(0, 0, 10), {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, 0, 0, "train labels");
  nd::testing::check_close(test.labels.slice(0, 0, 10), {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, 0, 0, "test labels");
  // Pixel (14, 12) of the first training image is 237 (an ankle boot).
  CHECK(train.images.data_ptr<float>()[14 * 28 + 12] == doctest::Approx(237 / 127.5 - 1).epsilon(1e-6));
  CHECK(min_max(train.images) == std::pair{-1.0f, 1.0f});
}
