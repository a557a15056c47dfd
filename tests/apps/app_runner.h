#pragma once
// What the app tests share (tests/apps/apps_test.cpp, tests/dist/apps_dist_test.cpp):
// where the built apps are, a scratch folder per test process, running a shell command
// with its output captured, reading a metrics file's lines, and decoding a PNG's size.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <zlib.h>

namespace nd::testing {

namespace fs = std::filesystem;

// build/apps, next to this test binary's folder.
inline fs::path apps_dir() { return fs::canonical("/proc/self/exe").parent_path().parent_path() / "apps"; }

// A fresh, empty `name` folder under this process's scratch folder (removed at exit).
inline fs::path temp_dir(const std::string& name) {
  struct Root {
    fs::path path = fs::temp_directory_path() / ("nanoddp_" + fs::canonical("/proc/self/exe").filename().string() +
                                                 "_" + std::to_string(getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Root root;
  const fs::path dir = root.path / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Run {
  int status;          // exit status, or -1 when it did not exit normally
  std::string output;  // stdout and stderr
};

// Runs `command` through the shell with stdout and stderr sent to `log`, and returns both.
inline Run run_logged(const std::string& command, const fs::path& log) {
  const std::string cmd = command + " > " + log.string() + " 2>&1";
  const int raw = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, text.str()};
}

inline std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Minimal PNG reader: checks the signature, every chunk's CRC and that the IDAT stream
// inflates to height scanlines of (1 + width * channels) bytes; returns {width, height}.
inline std::pair<int, int> png_size(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 8);
  REQUIRE(bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  auto u32 = [&](size_t at) {
    return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
           (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
  };
  int width = 0, height = 0, channels = 0;
  std::string idat;
  for (size_t at = 8; at + 12 <= bytes.size();) {
    const uint32_t len = u32(at);
    REQUIRE(at + 12 + len <= bytes.size());
    const std::string type = bytes.substr(at + 4, 4);
    const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(bytes.data() + at + 4), len + 4);
    CHECK(crc == u32(at + 8 + len));
    if (type == "IHDR") {
      width = int(u32(at + 8)), height = int(u32(at + 12));
      CHECK(bytes[at + 16] == 8);  // bit depth
      channels = bytes[at + 17] == 0 ? 1 : bytes[at + 17] == 2 ? 3 : 0;
    } else if (type == "IDAT") {
      idat += bytes.substr(at + 8, len);
    }
    at += 12 + len;
  }
  REQUIRE(channels > 0);
  std::vector<uint8_t> raw(size_t(height) * (1 + size_t(width) * channels) + 1);
  uLongf raw_size = raw.size();
  REQUIRE(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) == Z_OK);
  CHECK(raw_size == size_t(height) * (1 + size_t(width) * channels));
  return {width, height};
}

}  // namespace nd::testing
