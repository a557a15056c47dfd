#pragma once
// What the app tests share (tests/apps/apps_test.cpp, tests/dist/apps_dist_test.cpp):
// where the built apps are, a scratch folder per test process, running a shell command
// with its output captured, and reading a metrics file's lines.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

}  // namespace nd::testing
