#pragma once
// What the app tests share (tests/apps/*_test.cpp, tests/dist/apps_dist_test.cpp): where
// the built apps are, a scratch folder per test process, running a shell command with
// its output captured, reading a metrics file's lines, decoding a PNG's size, comparing
// two runs' checkpoints, and for the tests that kill jobs (apps_kill_test.cpp,
// mpirun_restart_test.cpp): a job in its own session, its processes, killing them all.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <zlib.h>

#include "harness.h"

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

// Runs build/apps/<app> with `args` (and `env` assignments before it), output captured.
inline Run run_app(const std::string& app, const std::string& args, const std::string& env = "") {
  return run_logged(env + " " + (apps_dir() / app).string() + " " + args, temp_dir("logs") / (app + ".log"));
}

inline std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// True, with doctest's "SKIPPED:" message, when this build or machine cannot run mpirun.
inline bool mpirun_missing() {
#ifndef NANODDP_WITH_MPI
  MESSAGE("SKIPPED: built without MPI");
  return true;
#else
  if (std::system("command -v mpirun > /dev/null 2>&1") == 0) return false;
  MESSAGE("SKIPPED: no mpirun on PATH");
  return true;
#endif
}

// mpirun's options for the apps in tests: root in a container, more ranks than cores,
// one OpenMP thread per rank (the CPU conv weight gradient is only run-to-run exact then,
// see apps_test.cpp; the command sets OMP_NUM_THREADS=1) and a collective timeout that a
// loaded machine never reaches.
inline std::string mpirun_test_options() {
  return "--allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x NANODDP_COLLECTIVE_TIMEOUT_S=120";
}

// Every "model.*" tensor of two checkpoints: |a - b| <= tol (1 + |b|). One exception:
// the key part of an attention's packed q/k/v bias ([E, 2E) of MultiheadAttention's
// in_proj_bias, or of the MAE blocks' attn.qkv.bias). softmax(q . (k + b)) does not
// depend on b, so its true gradient is 0 and what arrives is rounding noise, which
// Adam scales up to lr-sized steps that differ with the summation order.
inline void check_same_models(const fs::path& a, const fs::path& b, double tol) {
  const TensorDict ta = load(a.string()), tb = load(b.string());
  int compared = 0;
  for (const auto& [name, t] : ta) {
    if (name.rfind("model.", 0) != 0 || name.find("num_batches_tracked") != std::string::npos) continue;
    REQUIRE(tb.count(name));
    const auto ends_with = [&](const std::string& tail) {
      return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (tol > 0 && (ends_with("attn.in_proj_bias") || ends_with("attn.qkv.bias"))) {
      const int64_t E = t.size(0) / 3;
      for (int64_t part : {int64_t(0), 2 * E}) check_close(t.narrow(0, part, E), tb.at(name).narrow(0, part, E), tol, tol, name);
    } else {
      check_close(t, tb.at(name), tol, tol, name);
    }
    ++compared;
  }
  CHECK(compared > 0);
}

// A metrics line without what the process measured rather than computed: its speed
// (steps_per_s) and its allocator's peak (peak_mem_bytes, which counts the process's
// whole history, so a resumed process reports less than an uninterrupted one).
inline std::string without_measured(std::string line) {
  for (const char* key : {",\"steps_per_s\":", ",\"peak_mem_bytes\":"}) {
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    const size_t end = line.find_first_of(",}", at + 1);
    line = line.substr(0, at) + line.substr(end);
  }
  return line;
}

// A run in `parts` (interrupted and resumed) equals the uninterrupted one in `whole`
// bit for bit: every tensor of the final checkpoints (the models' parameters and
// buffers, the optimizers' and schedulers' state), and metrics.jsonl holds steps 1..S
// once each, in order, with the same values.
inline void check_same_training(const fs::path& whole, const fs::path& parts, int64_t steps) {
  const fs::path whole_ckpt = whole / "ckpt" / "latest.safetensors", parts_ckpt = parts / "ckpt" / "latest.safetensors";
  CHECK(load_metadata(parts_ckpt.string()).at("step") == std::to_string(steps));
  const TensorDict a = load(whole_ckpt.string()), b = load(parts_ckpt.string());
  CHECK(a.size() == b.size());
  int models = 0;
  for (const auto& [name, t] : a) {
    CAPTURE(name);
    REQUIRE(b.count(name));
    CHECK(to_vector(t) == to_vector(b.at(name)));
    models += name.rfind("model.", 0) == 0;
  }
  CHECK(models > 0);

  const auto whole_lines = read_lines(whole / "metrics.jsonl"), lines = read_lines(parts / "metrics.jsonl");
  REQUIRE(whole_lines.size() == static_cast<size_t>(steps));
  REQUIRE(lines.size() == whole_lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(i);
    CHECK(lines[i].rfind("{\"step\":" + std::to_string(i + 1) + ",", 0) == 0);
    CHECK(without_measured(lines[i]) == without_measured(whole_lines[i]));
  }
}

// {state, session} of a process from /proc/<pid>/stat; {0, 0} when gone.
inline std::pair<char, pid_t> proc_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return {0, 0};
  char state = 0;
  long ppid = 0, pgrp = 0, session = 0;
  if (std::sscanf(stat.c_str() + paren + 1, " %c %ld %ld %ld", &state, &ppid, &pgrp, &session) != 4) return {0, 0};
  return {state, static_cast<pid_t>(session)};
}

// Every live process (zombies excepted) of session `sid`.
inline std::vector<pid_t> session_members(pid_t sid) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const auto [state, session] = proc_state(pid);
    if (session == sid && state != 'Z' && state != 'X') out.push_back(pid);
  }
  return out;
}

// `command` through sh, in a new session (id = the returned pid, which the command
// inherits through exec; mpirun's ranks stay in the session although OpenMPI gives each
// its own process group), stdin from /dev/null, output to `log`.
inline pid_t start_in_own_session(const std::string& command, const fs::path& log) {
  const std::string line = "exec " + command;
  const std::string log_path = log.string();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setsid();
    const int in = open("/dev/null", O_RDONLY), out = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0) _exit(127);
    dup2(in, 0), dup2(out, 1), dup2(out, 2);
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The process of session `sid` running `program` as MPI rank `rank`; 0 when there is none.
inline pid_t rank_pid(pid_t sid, const std::string& program, int rank) {
  for (pid_t pid : session_members(sid)) {
    const std::string proc = "/proc/" + std::to_string(pid);
    if (read_text(proc + "/comm") != program + "\n") continue;
    std::string environ = read_text(proc + "/environ");
    for (char& c : environ)
      if (c == '\0') c = '\n';
    if (contains("\n" + environ, "\nOMPI_COMM_WORLD_RANK=" + std::to_string(rank) + "\n")) return pid;
  }
  return 0;
}

// The step of metrics.jsonl's last whole line; 0 when there is none.
inline int64_t last_step(const fs::path& metrics) {
  const std::vector<std::string> lines = read_lines(metrics);
  for (auto line = lines.rbegin(); line != lines.rend(); ++line)
    if (line->rfind("{\"step\":", 0) == 0 && line->back() == '}') return std::stoll(line->substr(8));
  return 0;
}

// SIGKILLs every live process of session `sid`, its leader first, until none is left
// (a killed orphan may linger as a zombie only); returns how many it found.
inline size_t kill_session(pid_t sid) {
  size_t found = 0;
  for (int round = 0; round < 500; ++round) {
    const std::vector<pid_t> alive = session_members(sid);
    if (round == 0) found = alive.size();
    if (alive.empty()) return found;
    for (pid_t pid : alive)
      if (pid == sid) kill(pid, SIGKILL);
    for (pid_t pid : alive)
      if (pid != sid) kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  FAIL("a process of the killed job survived SIGKILL for 10 s");
  return found;
}

// What OpenMPI leaves behind when its job dies by SIGKILL, to be removed afterwards:
// mpirun's session folder (<tmp>/ompi.<host>.<uid>/pid.<mpirun's pid>) and the shared
// memory segments the live processes of session `sid` have mapped (/dev/shm/...).
inline std::set<fs::path> mpi_leftovers(pid_t sid) {
  std::set<fs::path> out;
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path()))
    if (entry.path().filename().string().rfind("ompi.", 0) == 0) out.insert(entry.path() / ("pid." + std::to_string(sid)));
  for (pid_t pid : session_members(sid)) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    for (std::string line; std::getline(maps, line);)
      if (const size_t at = line.find("/dev/shm/"); at != std::string::npos) out.insert(line.substr(at));
  }
  return out;
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
