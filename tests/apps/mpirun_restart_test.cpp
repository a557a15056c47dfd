// apps/mpirun_restart, the restart launcher, on real jobs under mpirun:
// - train_joint on 2 ranks whose rank 1 is SIGKILLed twice (the launcher restarts it
//   twice with --resume) ends equal to an uninterrupted 2-rank run bit for bit: every
//   tensor of the final checkpoint and every metrics line;
// - killed once and restarted with 1 rank (--np-on-restart 1), it ends equal to the
//   uninterrupted 2-rank run up to float rounding (same global batches: --batch-size is
//   global; only the reduction order differs);
// - killed before its first checkpoint, it is started afresh (--overwrite) and ends equal
//   to an uninterrupted run bit for bit; without a checkpoint a restart only runs afresh
//   when --out held no run before the first start;
// - SIGTERM / SIGINT to the launcher end the ranks and are not restarted; a job failing
//   every time is restarted --max-restarts times with --resume appended once, and the
//   launcher exits with its last status and names the rank mpirun reported; status 2 (a
//   bad command line) is not retried; bad launcher flags are one line and exit 2.
//
// Timing without sleeps: rank 1 (the train_joint process of the launcher's session whose
// environment says OMPI_COMM_WORLD_RANK=1) is killed once metrics.jsonl shows a step past
// a checkpoint: step kCkptEvery + 1 for the first kill, then kCkptEvery + 1 steps past the
// step seen at the previous kill, by a rank of the restarted job (a new pid); lines past
// that step can only come from it. Were the job to finish before every kill landed, the
// run is repeated with twice the steps (as in apps_kill_test.cpp).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/app_runner.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing;

namespace {

constexpr int64_t kFirstSteps = 80, kCkptEvery = 4;

std::string launcher() { return (fs::path(NANODDP_SOURCE_DIR) / "apps" / "mpirun_restart").string(); }

// `options` for the launcher, then `program` under it, with the tests' mpirun options.
std::string launch_command(const std::string& options, const std::string& program) {
  return "env OMP_NUM_THREADS=1 " + launcher() + " " + options + " --mpi-args '" + mpirun_test_options() + "' -- " +
         program;
}

// The small train_joint of apps_kill_test.cpp.
std::string joint(const fs::path& out, int64_t steps, int64_t ckpt_every = kCkptEvery) {
  return (apps_dir() / "train_joint").string() + " --steps " + std::to_string(steps) +
         " --batch-size 4 --gwidth 4 --ndf 8 --log-every 1 --sample-every 1000 --ckpt-every " +
         std::to_string(ckpt_every) + " --out " + out.string();
}

struct Outcome {
  bool all_kills_landed = false;  // false: the job finished first; re-time with more steps
  int status = -1;                // the launcher's exit status
  std::string output;             // the launcher's, mpirun's and the ranks' output
};

// Runs `command` (the launcher) writing into `out`, SIGKILLs rank 1 of its job `kills`
// times as described at the top (the first time at step `first_kill`), and waits for the
// launcher to exit.
Outcome run_and_kill_rank1(const std::string& command, const fs::path& out, int kills, const fs::path& log,
                           int64_t first_kill) {
  const pid_t job = start_in_own_session(command, log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  std::vector<pid_t> killed;
  int64_t threshold = first_kill;
  int status = 0;
  while (static_cast<int>(killed.size()) < kills) {
    if (waitpid(job, &status, WNOHANG) == job) break;
    const pid_t rank1 = rank_pid(job, "train_joint", 1);
    const int64_t step = last_step(out / "metrics.jsonl");
    if (rank1 != 0 && std::find(killed.begin(), killed.end(), rank1) == killed.end() && step >= threshold) {
      REQUIRE(kill(rank1, SIGKILL) == 0);
      killed.push_back(rank1);
      threshold = step + kCkptEvery + 1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill_session(job);
      waitpid(job, &status, 0);
      INFO(read_text(log));
      FAIL("the job was killed ", killed.size(), " of ", kills, " times after 240 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Outcome result;
  result.all_kills_landed = static_cast<int>(killed.size()) == kills;
  if (result.all_kills_landed) REQUIRE(waitpid(job, &status, 0) == job);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.output = read_text(log);
  INFO(result.output);
  CHECK(session_members(job).empty());  // mpirun, its ranks and the launcher's tail are gone
  kill_session(job);
  return result;
}

// Runs the launcher with `options` on train_joint (a checkpoint every `ckpt_every` steps),
// killing rank 1 `kills` times, the first at step `first_kill`, with kFirstSteps, then
// twice and four times as many steps until every kill landed mid-run; returns the steps
// of that run (written into `parts`) and its outcome.
std::pair<int64_t, Outcome> restarted_run(const std::string& options, int kills, fs::path& parts,
                                          int64_t ckpt_every = kCkptEvery, int64_t first_kill = kCkptEvery + 1) {
  int64_t steps = kFirstSteps;
  for (int attempt = 1; attempt <= 3; ++attempt, steps *= 2) {
    parts = temp_dir("parts_" + std::to_string(attempt));
    Outcome o = run_and_kill_rank1(launch_command(options, joint(parts, steps, ckpt_every)), parts, kills,
                                   temp_dir("logs") / ("restarted_" + std::to_string(attempt) + ".log"), first_kill);
    INFO(o.output);
    REQUIRE(o.status == 0);
    if (o.all_kills_landed) return {steps, o};
    MESSAGE("attempt ", attempt, ": the job finished before ", kills, " kills; again with ", 2 * steps, " steps");
  }
  FAIL("the job finished before it was killed ", kills, " times, three times");
  return {};
}

// The uninterrupted reference: train_joint under plain mpirun -np 2.
fs::path whole_run(int64_t steps) {
  const fs::path whole = temp_dir("whole");
  const Run w = run_logged("env OMP_NUM_THREADS=1 mpirun " + mpirun_test_options() + " -np 2 " + joint(whole, steps),
                           temp_dir("logs") / "whole.log");
  INFO(w.output);
  REQUIRE(w.status == 0);
  return whole;
}

// A job whose rank 1 prints its arguments and exits with 3; rank 0 waits to be ended by mpirun.
const std::string kFailing = "sh -c 'test $OMPI_COMM_WORLD_RANK = 1 || exec sleep 100; echo \"args [$*]\"; exit 3' sh";

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The launcher's `reports` failure lines in `output`, each "the job failed with status
// <status> (<which rank>)", where <which rank> is `named` exactly when mpirun's report
// (`mpirun_says`) came after the previous failure line, else "mpirun named no rank".
// OpenMPI 4.1 names the rank reliably when the ranks are MPI processes (train_joint: 8
// runs of 8) but drops its report in some runs (3 of 8) when it has to kill a rank that
// never called MPI_Init (the `sleep` rank of the tests below).
void check_failure_reports(const std::string& output, int status, const std::string& mpirun_says,
                           const std::string& named, size_t reports) {
  const std::string head = "mpirun_restart: the job failed with status " + std::to_string(status) + " (";
  CHECK(count(output, head) == reports);
  size_t from = 0;
  for (size_t at = output.find(head); at != std::string::npos; from = at, at = output.find(head, at + 1)) {
    const std::string line = output.substr(at, output.find('\n', at) - at);
    CAPTURE(line);
    const bool said = contains(output.substr(from, at - from), mpirun_says);
    CHECK(line.rfind(head + (said ? named : "mpirun named no rank") + ")", 0) == 0);
  }
}

}  // namespace

TEST_CASE("launcher: rank 1 of train_joint SIGKILLed twice, the launcher resumes it twice and the result equals "
          "an uninterrupted run bit for bit") {
  if (mpirun_missing()) return;
  fs::path parts;
  const auto [steps, o] = restarted_run("-np 2 --max-restarts 2", 2, parts);
  INFO(o.output);
  check_failure_reports(o.output, 137, "process rank 1 with PID", "rank 1 exited on signal 9 (Killed)", 2);
  CHECK(contains(o.output, "restart 1 of 2 with 2 rank(s) and --resume"));
  CHECK(contains(o.output, "restart 2 of 2 with 2 rank(s) and --resume"));
  check_same_training(whole_run(steps), parts, steps);
}

TEST_CASE("launcher: killed at 2 ranks and restarted with 1 (--np-on-restart 1), train_joint ends as an "
          "uninterrupted 2-rank run up to float rounding") {
  if (mpirun_missing()) return;
  fs::path parts;
  const auto [steps, o] = restarted_run("-np 2 --np-on-restart 1 --max-restarts 1", 1, parts);
  INFO(o.output);
  check_failure_reports(o.output, 137, "process rank 1 with PID", "rank 1 exited on signal 9 (Killed)", 1);
  CHECK(contains(o.output, "restart 1 of 1 with 1 rank(s) and --resume"));
  const fs::path ckpt = parts / "ckpt" / "latest.safetensors";
  CHECK(load_metadata(ckpt.string()).at("world_size") == "1");  // the last stretch really ran on 1 rank
  CHECK(load_metadata(ckpt.string()).at("step") == std::to_string(steps));
  CHECK(read_lines(parts / "metrics.jsonl").size() == static_cast<size_t>(steps));
  check_same_models(whole_run(steps) / "ckpt" / "latest.safetensors", ckpt, 1e-4);
}

TEST_CASE("launcher: train_joint whose rank 1 is SIGKILLed before the first checkpoint starts afresh (with "
          "--overwrite) and ends equal to an uninterrupted run bit for bit") {
  if (mpirun_missing()) return;
  fs::path parts;
  // A checkpoint only at the end; rank 1 killed at step 3.
  const auto [steps, o] = restarted_run("-np 2 --max-restarts 1", 1, parts, 100000, 3);
  INFO(o.output);
  CHECK(contains(o.output, "restart 1 of 1 with 2 rank(s) afresh with --overwrite (no checkpoint at " +
                               (parts / "ckpt" / "latest.safetensors").string() + " yet)\n"));
  CHECK(contains(o.output, "--overwrite: deleted "));
  CHECK(contains(o.output, "steps 1.." + std::to_string(steps)));
  check_same_training(whole_run(steps), parts, steps);
}

TEST_CASE("launcher: without a checkpoint a restart runs afresh with --overwrite when --out held no run at the "
          "start, else with the arguments as given") {
  if (mpirun_missing()) return;
  const fs::path logs = temp_dir("logs");
  const fs::path fresh = temp_dir("fresh"), taken = temp_dir("taken");
  const Run r = run_logged(launch_command("-np 2 --max-restarts 1", kFailing + " --out=" + fresh.string()),
                           logs / "fresh.log");
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK(count(r.output, "args [--out=" + fresh.string() + "]") == 1);
  CHECK(count(r.output, "args [--out=" + fresh.string() + " --overwrite]") == 1);
  CHECK(contains(r.output, "); restart 1 of 1 with 2 rank(s) afresh with --overwrite (no checkpoint at " +
                               fresh.string() + "/ckpt/latest.safetensors yet)\n"));
  std::ofstream(taken / "metrics.jsonl") << "{\"step\":1}\n";
  const Run t = run_logged(launch_command("-np 2 --max-restarts 1", kFailing + " --out " + taken.string()),
                           logs / "taken.log");
  INFO(t.output);
  CHECK(t.status == 3);
  CHECK(count(t.output, "args [--out " + taken.string() + "]") == 2);
  CHECK(contains(t.output, "); restart 1 of 1 with 2 rank(s) as given (no checkpoint at " + taken.string() +
                               "/ckpt/latest.safetensors, and " + taken.string() +
                               " held a run before the first start)\n"));
}

TEST_CASE("launcher: SIGTERM and SIGINT reach the ranks through mpirun and the job is not restarted") {
  if (mpirun_missing()) return;
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    const fs::path log = temp_dir("logs") / ("signal_" + std::to_string(sig) + ".log");
    const pid_t job = start_in_own_session(launch_command("-np 2 --max-restarts 3", "sleep 100"), log);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (rank_pid(job, "sleep", 0) == 0 || rank_pid(job, "sleep", 1) == 0) {
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "the ranks did not start within 60 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(kill(job, sig) == 0);
    int status = 0;
    while (waitpid(job, &status, WNOHANG) != job) {
      if (std::chrono::steady_clock::now() > deadline) kill_session(job);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string output = read_text(log);
    INFO(output);
    CHECK(std::chrono::steady_clock::now() < deadline);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) != 0));  // mpirun's status for a job it was told to end
    CHECK(contains(output, std::string("mpirun_restart: got SIG") + (sig == SIGTERM ? "TERM" : "INT") +
                               ": passing it to mpirun"));
    CHECK_FALSE(contains(output, "restart 1"));
    CHECK(session_members(job).empty());
    kill_session(job);
  }
}

TEST_CASE("launcher: a job failing every time runs 1 + --max-restarts times with --resume appended, then the "
          "launcher exits with its status, and status 2 is not retried") {
  if (mpirun_missing()) return;
  const fs::path logs = temp_dir("logs");
  // kFailing's --out has a checkpoint (an empty file will do: the launcher only looks for it).
  const fs::path out = temp_dir("failing");
  fs::create_directories(out / "ckpt");
  std::ofstream(out / "ckpt" / "latest.safetensors").put('\n');
  const Run r = run_logged(launch_command("-np 2 --max-restarts 2", kFailing + " --out " + out.string()),
                           logs / "failing.log");
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK(count(r.output, "args [--out " + out.string() + "]") == 1);
  CHECK(count(r.output, "args [--out " + out.string() + " --resume]") == 2);
  check_failure_reports(r.output, 3, "Process name: [[", "rank 1 exited with code 3", 3);
  CHECK(contains(r.output, "); restart 1 of 2 with 2 rank(s) and --resume\n"));
  CHECK(contains(r.output, "); restart 2 of 2 with 2 rank(s) and --resume\n"));
  CHECK(contains(r.output, ") after 2 restart(s) of 2; giving up\n"));

  const Run usage = run_logged(launch_command("-np 1 --max-restarts 2", "sh -c 'exit 2'"), logs / "usage.log");
  INFO(usage.output);
  CHECK(usage.status == 2);
  CHECK(contains(usage.output, "mpirun_restart: the job exited with status 2 (a bad command line): not restarted"));
  CHECK_FALSE(contains(usage.output, "restart 1"));
}

TEST_CASE("launcher: a bad launcher flag is one line naming it, exit status 2") {
  const struct {
    std::string args, message;
  } cases[] = {
      {"--max-restarts x true", "--max-restarts: expected a whole number >= 0, found 'x'"},
      {"-np 0 true", "-np: expected a whole number >= 1, found '0'"},
      {"-np", "-np needs a value"},
      {"--np-on-restart 1 true", "--np-on-restart needs -np (the first run's ranks)"},
      {"--max-restart 2 true", "unknown option '--max-restart'"},
      {"-np 2", "no program to run"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const Run r = run_logged(launcher() + " " + c.args, temp_dir("logs") / "flags.log");
    CHECK(r.status == 2);
    CHECK(r.output == "mpirun_restart: " + c.message + " (run 'mpirun_restart --help' for the options)\n");
  }
  const Run help = run_logged(launcher() + " --help", temp_dir("logs") / "help.log");
  CHECK(help.status == 0);
  for (const char* flag : {"-np N", "--max-restarts N", "--np-on-restart N", "--mpi-args"}) CHECK(contains(help.output, flag));
}
