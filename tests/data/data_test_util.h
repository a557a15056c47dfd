#pragma once
// What the tests/data suites share: a temporary directory, files as bytes, the committed
// images and their golden pixels (tests/golden/make_data_images_golden.py).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"

namespace nd::testing {

using Bytes = std::vector<uint8_t>;

// A fresh directory per test process (ctest runs test cases in parallel processes)
// and per TempDir within it.
struct TempDir {
  inline static int count = 0;
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("nanoddp_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
  TempDir() {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Writes `bytes` to `path`, creating its directory.
inline void write_bytes(const std::string& path, const Bytes& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

inline std::string golden_image(const std::string& name) {
  return std::string(NANODDP_SOURCE_DIR) + "/tests/golden/images/" + name;
}

// root/a, root/b: n PNGs of 24-40 x 20-32 seeded random pixels (image i, "%03d.png", in
// class a when i is even, b when odd), and copies of the committed a/j420.jpg and
// b/j444.jpg, so that both decoders run: n + 2 samples.
inline void make_image_folder(const std::filesystem::path& root, int n) {
  Generator gen{99, 0};
  for (int i = 0; i < n; ++i) {
    const int64_t h = 24 + i % 17, w = 20 + i % 13;
    const std::string png = encode_png(randint(0, 256, {3, h, w}, TensorOptions(kInt64), &gen).to(kUInt8));
    char name[32];
    std::snprintf(name, sizeof name, "%s/%03d.png", i % 2 ? "b" : "a", i);
    write_bytes((root / name).string(), Bytes(png.begin(), png.end()));
  }
  write_bytes((root / "a/j420.jpg").string(), data::read_file(golden_image("j420.jpg")));
  write_bytes((root / "b/j444.jpg").string(), data::read_file(golden_image("j444.jpg")));
}

// A tar file as GNU tar and Python's tarfile write it for names under 100 bytes: per member
// a ustar header block (mode 0644, mtime 0, type '0', octal fields, checksum), the data
// padded to 512 bytes; then tar's end-of-archive, two zero blocks.
struct TarMember {
  std::string name;
  Bytes data;
};
inline Bytes make_tar(const std::vector<TarMember>& members) {
  Bytes out;
  for (const TarMember& m : members) {
    REQUIRE(m.name.size() < 100);
    char h[512] = {};
    std::memcpy(h, m.name.data(), m.name.size());
    std::snprintf(h + 100, 8, "%07o", 0644);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(m.data.size()));
    std::snprintf(h + 136, 12, "%011o", 0);
    h[156] = '0';
    std::memcpy(h + 257, "ustar\0" "00", 8);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (char c : h) sum += static_cast<uint8_t>(c);
    std::snprintf(h + 148, 8, "%06o", sum);  // six digits, NUL, space
    h[155] = ' ';
    out.insert(out.end(), h, h + 512);
    out.insert(out.end(), m.data.begin(), m.data.end());
    out.resize((out.size() + 511) / 512 * 512, 0);
  }
  out.resize(out.size() + 1024, 0);
  return out;
}

inline Bytes text_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// tests/golden/data_images.safetensors, loaded once.
inline const TensorDict& image_goldens() {
  static const TensorDict goldens = load(std::string(NANODDP_SOURCE_DIR) + "/tests/golden/data_images.safetensors");
  return goldens;
}

}  // namespace nd::testing

// The names every tests/data suite uses unqualified.
using nd::testing::Bytes;
using nd::testing::error_message;
using nd::testing::golden_image;
using nd::testing::make_image_folder;
using nd::testing::make_tar;
using nd::testing::TarMember;
using nd::testing::text_bytes;
using nd::testing::TempDir;
using nd::testing::write_bytes;
