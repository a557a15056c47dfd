// Resume after a real crash, and after a graceful stop (at the end): train_joint under `mpirun -np 2` is killed with SIGKILL
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
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "apps/app_runner.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing;

namespace {

constexpr int64_t kFirstSteps = 40, kCkptEvery = 4;

// Small enough for a loaded 2-core machine.
std::string joint_command(const fs::path& out, int64_t steps, const std::string& extra = "") {
  return "env OMP_NUM_THREADS=1 mpirun " + mpirun_test_options() + " -np 2 " + (apps_dir() / "train_joint").string() +
         " --steps " + std::to_string(steps) + " --batch-size 4 --gwidth 4 --ndf 8 --log-every 1 --sample-every 1000 " +
         "--ckpt-every " + std::to_string(kCkptEvery) + " --out " + out.string() + extra;
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

}  // namespace

TEST_CASE("apps: train_joint on 2 ranks killed with SIGKILL after a checkpoint resumes to the uninterrupted "
          "run, bit for bit") {
  if (mpirun_missing()) return;
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
  check_same_training(whole, parts, steps);
}

// The graceful stop on 2 ranks: SIGTERM to rank 1 alone (the ranks agree on the stop
// through an all-reduce every step), or SIGINT to mpirun (which passes SIGTERM to the
// ranks, then SIGKILL 1 s later, OpenMPI's odls_base_sigkill_timeout): both ranks end
// after the same step with that step's checkpoint, rank 0 says so, and --resume then
// finishes equal to an uninterrupted run bit for bit (were the ranks to stop at different
// steps, one would wait in a collective and the checkpoint would not continue exactly).
// The signal goes once metrics.jsonl has step 3; were it to land after the last step,
// the run is repeated with twice the steps.
TEST_CASE("apps: train_joint on 2 ranks stopped by SIGTERM to rank 1, or SIGINT to mpirun, stops both ranks after "
          "the same step with a checkpoint, and --resume continues bit for bit") {
  if (mpirun_missing()) return;
  for (const bool to_mpirun : {false, true}) {
    CAPTURE(to_mpirun);
    const fs::path logs = temp_dir("logs");
    int64_t steps = to_mpirun ? 250 : 100, stopped = 0;
    fs::path parts;
    for (int attempt = 1; attempt <= 3 && stopped == 0; ++attempt, steps *= 2) {
      parts = temp_dir("stopped_" + std::to_string(attempt));
      const fs::path log = logs / ("stopped_" + std::to_string(attempt) + ".log");
      const pid_t job = start_in_own_session(joint_command(parts, steps), log);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
      pid_t target = 0;
      int status = 0;
      while (target == 0) {
        REQUIRE_MESSAGE(waitpid(job, &status, WNOHANG) == 0, read_text(log));
        if (last_step(parts / "metrics.jsonl") >= 3) target = to_mpirun ? job : rank_pid(job, "train_joint", 1);
        if (std::chrono::steady_clock::now() > deadline) {
          kill_session(job);
          FAIL("no metrics line for step 3 after 240 s");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      REQUIRE(kill(target, to_mpirun ? SIGINT : SIGTERM) == 0);
      REQUIRE(waitpid(job, &status, 0) == job);
      const std::string output = read_text(log);
      INFO(output);
      CHECK(session_members(job).empty());
      kill_session(job);
      REQUIRE(WIFEXITED(status));
      if (WEXITSTATUS(status) == 0) {
        MESSAGE("attempt ", attempt, ": the stop landed after step ", steps, ", the last; again with ", 2 * steps);
        continue;
      }
      if (!to_mpirun) CHECK(WEXITSTATUS(status) == 143);  // the ranks' status; mpirun told to stop says 1
      CHECK_FALSE(contains(output, "watchdog"));
      const fs::path ckpt = parts / "ckpt" / "latest.safetensors";
      REQUIRE(fs::exists(ckpt));
      stopped = std::stoll(load_metadata(ckpt.string()).at("step"));
      CHECK(last_step(parts / "metrics.jsonl") == stopped);
      CHECK(contains(output, "train_joint: got SIGTERM: stopped after step " + std::to_string(stopped) + " of " +
                                 std::to_string(steps) + ", checkpoint " + ckpt.string() + "\n"));
      CHECK(contains(output, "train_joint: to continue: mpirun -np 2 " + (apps_dir() / "train_joint").string()));
    }
    REQUIRE(stopped > 0);
    steps /= 2;
    const Run r = run_logged(joint_command(parts, steps, " --resume"), logs / "resumed.log");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(contains(r.output, "steps " + std::to_string(stopped + 1) + ".." + std::to_string(steps)));
    const fs::path whole = temp_dir("whole");
    const Run w = run_logged(joint_command(whole, steps), logs / "whole.log");
    INFO(w.output);
    REQUIRE(w.status == 0);
    check_same_training(whole, parts, steps);
  }
}
