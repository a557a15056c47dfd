// Resume after a real crash: train_joint under `mpirun -np 2` is killed with SIGKILL
// (mpirun and both ranks, no chance to clean up) mid-training, after a checkpoint;
// `--resume` then finishes the run, which must equal an uninterrupted 2-rank run bit
// for bit (every model tensor of the final checkpoints) and whose metrics.jsonl must
// hold steps 1..S once each, equal to the uninterrupted run's (the lines the killed
// run wrote after its checkpoint are dropped). The --exit-after variant, a clean stop,
// is in apps_test.cpp and apps_dist_test.cpp.
//
// Timing without flakiness: checkpoints every kCkptEvery steps; the job is killed as
// soon as metrics.jsonl holds step kCkptEvery + 1 (the checkpoint of step kCkptEvery is
// written before that line, atomically, so it is complete), polling every 20 ms, with
// the last step far beyond (a step takes ~10 ms on an idle machine; a starved poller
// was seen to lag 20 steps). Were the kill to land too late (the job finished, or its
// last checkpoint is the final step) the interrupted run is repeated with twice the
// steps; the uninterrupted reference runs afterwards, with the steps that worked.
//
// The job runs in its own session and every process of that session is killed: OpenMPI
// gives each rank its own process group, so killing mpirun's group would leave the
// ranks running. This test launches mpirun itself, so it lives here and not in tests/dist/ (whose
// binaries CMake runs whole under mpirun).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "apps/app_runner.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing;

namespace {

constexpr int64_t kFirstSteps = 40, kCkptEvery = 4;
#ifdef NANODDP_WITH_MPI
constexpr bool kBuiltWithMpi = true;
#else
constexpr bool kBuiltWithMpi = false;
#endif

// Small enough for a loaded 2-core machine; one OpenMP thread per rank (the CPU conv
// weight gradient is only run-to-run exact then, see apps_test.cpp).
std::string joint_command(const fs::path& out, int64_t steps, const std::string& extra = "") {
  return "env OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS "
         "-x NANODDP_COLLECTIVE_TIMEOUT_S=120 -np 2 " +
         (apps_dir() / "train_joint").string() + " --steps " + std::to_string(steps) +
         " --batch-size 4 --gwidth 4 --ndf 8 --log-every 1 --sample-every 1000 --ckpt-every " +
         std::to_string(kCkptEvery) + " --out " + out.string() + extra;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// {state, session} of a process from /proc/<pid>/stat; {0, 0} when gone.
std::pair<char, pid_t> proc_state(pid_t pid) {
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
std::vector<pid_t> session_members(pid_t sid) {
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

// `command` through sh, in a new session (id = the returned pid, which mpirun inherits
// through exec; its ranks stay in the session although OpenMPI gives each its own
// process group), stdin from /dev/null, output to `log`.
pid_t start_in_own_session(const std::string& command, const fs::path& log) {
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

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// SIGKILLs every live process of session `sid`, mpirun (the leader) first, until none
// is left (a killed orphan may linger as a zombie only); returns how many it found.
size_t kill_session(pid_t sid) {
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
std::set<fs::path> mpi_leftovers(pid_t sid) {
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

struct Interrupted {
  bool killed_mid_training = false;  // false: re-time (the job got too far, or exited first)
  int64_t checkpoint_step = 0;
  size_t processes_killed = 0;  // live processes of the job's session at the kill
  size_t metrics_lines = 0;     // lines of metrics.jsonl right after the kill
};

// Starts the job, waits for the metrics line of step kCkptEvery + 1, then SIGKILLs
// every process of the job and reads the checkpoint it left.
Interrupted run_and_kill(const fs::path& out, int64_t steps, const fs::path& log) {
  const pid_t job = start_in_own_session(joint_command(out, steps), log);
  const fs::path metrics = out / "metrics.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  Interrupted result;
  int status = 0;
  for (;;) {
    if (waitpid(job, &status, WNOHANG) == job) {  // it ended on its own: finished or failed
      kill_session(job);
      INFO(read_text(log));
      REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "the job failed before it was killed");
      return result;
    }
    if (read_lines(metrics).size() >= static_cast<size_t>(kCkptEvery + 1)) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill_session(job);
      waitpid(job, &status, 0);
      INFO(read_text(log));
      FAIL("no metrics line for step ", kCkptEvery + 1, " after 240 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::set<fs::path> leftovers = mpi_leftovers(job);
  result.processes_killed = kill_session(job);
  // Removed before mpirun (a zombie until waited for) frees its pid for reuse.
  for (const fs::path& path : leftovers) {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  REQUIRE(waitpid(job, &status, 0) == job);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  result.metrics_lines = read_lines(metrics).size();
  const fs::path ckpt = out / "ckpt" / "latest.safetensors";
  REQUIRE_MESSAGE(fs::exists(ckpt), "no checkpoint although metrics.jsonl has step ", kCkptEvery + 1);
  result.checkpoint_step = std::stoll(load_metadata(ckpt.string()).at("step"));
  result.killed_mid_training = result.checkpoint_step < steps;
  return result;
}

// A metrics line without its timing ("steps_per_s"), the only value that may differ.
std::string without_timing(const std::string& line) {
  const size_t at = line.find(",\"steps_per_s\":");
  if (at == std::string::npos) return line;
  const size_t end = line.find_first_of(",}", at + 1);
  return line.substr(0, at) + line.substr(end);
}

}  // namespace

TEST_CASE("apps: train_joint on 2 ranks killed with SIGKILL after a checkpoint resumes to the uninterrupted "
          "run, bit for bit") {
  if (!kBuiltWithMpi) {
    MESSAGE("SKIPPED: built without MPI");
    return;
  }
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED: no mpirun on PATH");
    return;
  }
  const fs::path logs = temp_dir("logs");
  fs::path parts;
  Interrupted cut;
  int64_t steps = kFirstSteps;
  for (int attempt = 1; attempt <= 3; ++attempt, steps *= 2) {
    parts = temp_dir("parts_" + std::to_string(attempt));
    cut = run_and_kill(parts, steps, logs / ("killed_" + std::to_string(attempt) + ".log"));
    if (cut.killed_mid_training) break;
    MESSAGE("attempt ", attempt, ": the kill landed after step ", steps, ", the last; again with ", 2 * steps);
  }
  REQUIRE(cut.killed_mid_training);
  CHECK(cut.processes_killed >= 3);  // mpirun and both ranks
  CHECK(cut.checkpoint_step >= kCkptEvery);
  CHECK(cut.checkpoint_step % kCkptEvery == 0);
  MESSAGE("killed with a checkpoint at step ", cut.checkpoint_step, " of ", steps, " and ", cut.metrics_lines,
          " metrics lines");

  const Run r = run_logged(joint_command(parts, steps, " --resume"), logs / "resumed.log");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "steps " + std::to_string(cut.checkpoint_step + 1) + ".." + std::to_string(steps)));

  const fs::path whole = temp_dir("whole");
  const Run w = run_logged(joint_command(whole, steps), logs / "whole.log");
  INFO(w.output);
  REQUIRE(w.status == 0);
  const auto whole_lines = read_lines(whole / "metrics.jsonl");
  REQUIRE(whole_lines.size() == static_cast<size_t>(steps));

  const TensorDict a = load((whole / "ckpt" / "latest.safetensors").string());
  const TensorDict b = load((parts / "ckpt" / "latest.safetensors").string());
  CHECK(load_metadata((parts / "ckpt" / "latest.safetensors").string()).at("step") == std::to_string(steps));
  // Every tensor: the models' parameters and buffers, the optimizers' and the scheduler's state.
  CHECK(a.size() == b.size());
  int models = 0;
  for (const auto& [name, t] : a) {
    CAPTURE(name);
    REQUIRE(b.count(name));
    CHECK(to_vector(t) == to_vector(b.at(name)));
    models += name.rfind("model.", 0) == 0;
  }
  CHECK(models > 0);

  // Steps 1..S once each, in order, with the uninterrupted run's values.
  const auto lines = read_lines(parts / "metrics.jsonl");
  REQUIRE(lines.size() == whole_lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(i);
    CHECK(lines[i].rfind("{\"step\":" + std::to_string(i + 1) + ",", 0) == 0);
    CHECK(without_timing(lines[i]) == without_timing(whole_lines[i]));
  }
}
