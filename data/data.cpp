#include "data/data.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "engine/error.h"
#include "engine/factories.h"

namespace nd::data {

namespace {

// IDX files start with 4 bytes 0x00 0x00 <type> <ndims>, then ndims big-endian u32 sizes,
// then the elements in row-major order. gzread reads gzip and plain files alike, so one
// reader serves both; the data is read in chunks so a corrupt header that promises
// gigabytes allocates no more than the file really holds.
constexpr int kMaxDims = 4;
constexpr int64_t kMaxBytes = int64_t{1} << 36;  // 64 GiB: any larger header is corrupt
constexpr unsigned kChunk = 1u << 20;

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}
std::string hex32(uint32_t v) { return hex(v, 8); }

class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    std::error_code ec;
    ND_CHECK(!std::filesystem::is_directory(path, ec), "read_idx: cannot open '", path,
             "': it is a directory; expected an IDX file (gzip or plain)");
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    ND_CHECK(file_ != nullptr, "read_idx: cannot open '", path, "': ",
             errno ? std::strerror(errno) : "out of memory", "; expected an IDX file (gzip or plain)");
    gzbuffer(file_, 1u << 17);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes; fewer only at the end of the file. zlib errors (a damaged or
  // cut-off gzip stream, an I/O error) throw: short data must never pass silently.
  size_t read(void* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - got, kChunk));
      const int r = gzread(file_, static_cast<char*>(buf) + got, want);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      int code = Z_OK;
      const char* msg = gzerror(file_, &code);
      if (code == Z_OK) break;  // clean end of file
      std::string why = code == Z_ERRNO ? std::strerror(errno) : msg;
      if (why.rfind(path_ + ": ", 0) == 0) why.erase(0, path_.size() + 2);  // zlib prefixes the path
      throw Error("read_idx: '" + path_ + "' is truncated or corrupt: zlib reports \"" + why + "\" after " +
                  std::to_string(pos_ + got) + " uncompressed bytes");
    }
    pos_ += got;
    return got;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  size_t pos_ = 0;
};

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string find_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path plain = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  throw Error("load_fashion_mnist: '" + gz.string() + "' not found (nor '" + plain.string() +
              "'). Install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist, "
              "files in " + kFashionMnistDir + ") or point to a directory holding the Fashion-MNIST IDX files.");
}

}  // namespace

Tensor read_idx(const std::string& path) {
  GzReader in(path);
  unsigned char head[4];
  const size_t got_magic = in.read(head, 4);
  ND_CHECK(got_magic == 4, "read_idx: '", path, "' is truncated: expected a 4-byte IDX magic number, found ",
           got_magic, " bytes");
  const uint32_t magic = big_endian(head);
  ND_CHECK(head[0] == 0 && head[1] == 0, "read_idx: '", path, "' is not an IDX file: magic number ", hex32(magic),
           ", expected 0x00000801 (labels) or 0x00000803 (images)");
  ND_CHECK(head[2] == 0x08, "read_idx: '", path, "' has magic number ", hex32(magic), ": element type ",
           hex(head[2], 2), " is not supported, expected 0x08 (unsigned byte) as in 0x00000801 "
           "(labels) or 0x00000803 (images)");
  const int ndims = head[3];
  ND_CHECK(ndims >= 1 && ndims <= kMaxDims, "read_idx: '", path, "' has magic number ", hex32(magic), ": ",
           ndims, " dimensions, expected 1 to ", kMaxDims, " (0x00000801 labels, 0x00000803 images)");

  unsigned char dims_raw[4 * kMaxDims];
  const size_t want_dims = 4 * static_cast<size_t>(ndims);
  const size_t got_dims = in.read(dims_raw, want_dims);
  ND_CHECK(got_dims == want_dims, "read_idx: '", path, "' is truncated: magic number ", hex32(magic),
           " announces ", ndims, " dimension sizes (", want_dims, " bytes), found ", got_dims, " bytes");
  Shape shape;
  int64_t expected = 1;
  for (int d = 0; d < ndims; ++d) {
    shape.push_back(big_endian(dims_raw + 4 * d));
    ND_CHECK(shape.back() == 0 || expected <= kMaxBytes / shape.back(), "read_idx: '", path,
             "' is corrupt: its header promises more than ", kMaxBytes, " bytes of data (sizes ",
             shape_str(shape), "...)");
    expected *= shape.back();
  }

  // Read everything that is there (keeping at most `expected` bytes), then compare.
  std::vector<unsigned char> bytes;
  std::vector<unsigned char> chunk(kChunk);
  int64_t total = 0;
  for (;;) {
    const size_t got = in.read(chunk.data(), chunk.size());
    if (got == 0) break;
    if (total < expected) {
      const int64_t keep = std::min(static_cast<int64_t>(got), expected - total);
      bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + keep);
    }
    total += static_cast<int64_t>(got);
  }
  ND_CHECK(total >= expected, "read_idx: '", path, "' is truncated: its header says shape ", shape_str(shape),
           " = ", expected, " data bytes, found ", total);
  ND_CHECK(total == expected, "read_idx: '", path, "' has trailing data: its header says shape ",
           shape_str(shape), " = ", expected, " data bytes, found ", total);

  Tensor out = empty(shape, TensorOptions(kUInt8));
  if (expected > 0) std::memcpy(out.data_ptr<uint8_t>(), bytes.data(), static_cast<size_t>(expected));
  return out;
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  const std::string split = train ? "train" : "t10k";
  const std::string images_path = find_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, split + "-labels-idx1-ubyte");
  const Tensor images = read_idx(images_path);
  const Tensor labels = read_idx(labels_path);
  ND_CHECK(images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28, "load_fashion_mnist: '",
           images_path, "' holds shape ", shape_str(images.sizes()),
           ", expected images of shape [N, 28, 28] (magic 0x00000803)");
  ND_CHECK(labels.dim() == 1, "load_fashion_mnist: '", labels_path, "' holds shape ", shape_str(labels.sizes()),
           ", expected labels of shape [N] (magic 0x00000801)");
  const int64_t n = images.size(0);
  ND_CHECK(labels.size(0) == n, "load_fashion_mnist: '", images_path, "' holds ", n, " images but '",
           labels_path, "' holds ", labels.size(0), " labels; expected the same count (files of one split)");

  Dataset ds{empty({n, 1, 28, 28}), empty({n}, TensorOptions(kInt64))};
  const uint8_t* px = images.data_ptr<uint8_t>();
  float* x = ds.images.data_ptr<float>();
  for (int64_t i = 0; i < n * 28 * 28; ++i) x[i] = static_cast<float>(px[i]) / 127.5f - 1.0f;
  const uint8_t* lb = labels.data_ptr<uint8_t>();
  int64_t* y = ds.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    ND_CHECK(lb[i] < 10, "load_fashion_mnist: '", labels_path, "' has label ", int{lb[i]}, " at index ", i,
             ", expected a class index in [0, 10)");
    y[i] = lb[i];
  }
  return ds;
}

}  // namespace nd::data
