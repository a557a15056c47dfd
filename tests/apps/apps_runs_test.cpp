// The apps' runs, single rank (and one 2-rank refusal): one run per --out folder (a second
// start is refused, exit 2, naming --resume and --overwrite; --overwrite deletes only the
// run's files), failed starts leave no folder, --resume with --steps at or below the
// checkpoint is refused with both numbers, the first metrics line after a resume says how
// many steps it averages, and SIGINT / SIGTERM stop after a step with a checkpoint from
// which --resume continues bit for bit (a second signal ends the app at once).
// The 2-rank graceful stop is in apps_kill_test.cpp.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "apps/app_runner.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing;

namespace {

// A small train_gan or train_joint writing every step's metrics line.
std::string small(const std::string& app, const fs::path& out, int64_t steps) {
  return (app == "train_gan" ? std::string("--ngf 8 --ndf 8 ") : std::string("--gwidth 4 --ndf 8 ")) + "--steps " +
         std::to_string(steps) +
         " --batch-size 8 --log-every 1 --sample-every 100000 --ckpt-every 100000 --no-tensorboard --out " +
         out.string();
}

// Starts `command` (an app writing into `out`), waits for its metrics line of step 2, sends
// it `signals` (with 2 ms between them) and returns its raw wait status.
int signalled_run(const std::string& command, const fs::path& out, const std::vector<int>& signals,
                  const fs::path& log) {
  const pid_t pid = start_in_own_session(command, log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int status = 0;
  while (last_step(out / "metrics.jsonl") < 2) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      INFO(read_text(log));
      FAIL("the app ended before its second step");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill_session(pid);
      waitpid(pid, &status, 0);
      FAIL("no metrics line of step 2 after 120 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < signals.size(); ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    REQUIRE(kill(pid, signals[i]) == 0);
  }
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("apps: an --out that holds a run is refused (exit 2, one line naming --resume and --overwrite)") {
  const fs::path out = temp_dir("taken");
  const Run first = run_app("train_gan", small("train_gan", out, 2));
  INFO(first.output);
  REQUIRE(first.status == 0);
  const fs::path ckpt = out / "ckpt" / "latest.safetensors";
  const auto ckpt_time = fs::last_write_time(ckpt);
  const std::string metrics = read_text(out / "metrics.jsonl");
  const std::string message = "--out " + out.string() +
                              " already holds a run (metrics.jsonl and a checkpoint at step 2): add --resume to "
                              "continue it, or --overwrite to delete its files and start again";
  const Run again = run_app("train_gan", small("train_gan", out, 2));
  CHECK(again.status == 2);
  CHECK(again.output == "train_gan: " + message + " (run 'train_gan --help' for the options)\n");
  CHECK(fs::last_write_time(ckpt) == ckpt_time);
  CHECK(read_text(out / "metrics.jsonl") == metrics);

  // Every app, before it loads anything: a folder with only metrics.jsonl (a run that
  // died before its first checkpoint) is a run too; so is one with only a checkpoint.
  const fs::path lines_only = temp_dir("lines_only");
  std::ofstream(lines_only / "metrics.jsonl") << "{\"step\":1}\n";
  for (const char* app : {"train_gan", "train_mae", "train_joint", "train_classifier"}) {
    CAPTURE(app);
    const Run r = run_app(app, "--data /nonexistent --out " + lines_only.string());
    CHECK(r.status == 2);
    CHECK(r.output == std::string(app) + ": --out " + lines_only.string() +
                          " already holds a run (metrics.jsonl): add --resume to continue it, or --overwrite to "
                          "delete its files and start again (run '" + app + " --help' for the options)\n");
  }
  const fs::path ckpt_only = temp_dir("ckpt_only");
  fs::create_directories(ckpt_only / "ckpt");
  fs::copy_file(ckpt, ckpt_only / "ckpt" / "latest.safetensors");
  const Run c = run_app("train_gan", "--out " + ckpt_only.string());
  CHECK(c.status == 2);
  CHECK(contains(c.output, " already holds a run (a checkpoint at step 2): add --resume"));

  const Run both = run_app("train_gan", "--resume --overwrite --out " + out.string());
  CHECK(both.status == 2);
  CHECK(both.output == "train_gan: --resume and --overwrite cannot be combined: --resume continues the run in "
                       "--out, --overwrite deletes it (run 'train_gan --help' for the options)\n");
}

TEST_CASE("apps: --overwrite deletes the previous run's files, and only those, then starts again") {
  const fs::path out = temp_dir("overwrite");
  REQUIRE(run_app("train_gan", "--ngf 8 --ndf 8 --steps 4 --batch-size 8 --log-every 2 --sample-every 2 "
                               "--ckpt-every 2 --out " + out.string()).status == 0);
  REQUIRE(fs::exists(out / "samples_000002.png"));
  std::ofstream(out / "notes.txt") << "mine\n";
  std::ofstream(out / "ckpt" / "mine.safetensors") << "mine\n";
  fs::create_directories(out / "plots");
  std::ofstream(out / "plots" / "samples_000002.png") << "mine\n";
  const Run r = run_app("train_gan", small("train_gan", out, 3) + " --overwrite");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // metrics.jsonl, loss_curve.png, 2 sample PNGs, the event file, the checkpoint.
  CHECK(contains(r.output, "--overwrite: deleted 6 file(s) of the previous run in " + out.string() + "\n"));
  CHECK_FALSE(fs::exists(out / "samples_000002.png"));
  CHECK_FALSE(fs::exists(out / "samples_000004.png"));
  CHECK(fs::exists(out / "samples_000003.png"));  // the new run's last step
  for (const char* kept : {"notes.txt", "ckpt/mine.safetensors", "plots/samples_000002.png"}) CHECK(fs::exists(out / kept));
  for (const auto& entry : fs::directory_iterator(out))
    CHECK(entry.path().filename().string().rfind("events.out.tfevents.", 0) != 0);  // --no-tensorboard now
  const auto lines = read_lines(out / "metrics.jsonl");
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].rfind("{\"step\":1,", 0) == 0);
  CHECK(load_metadata((out / "ckpt" / "latest.safetensors").string()).at("step") == "3");
}

TEST_CASE("apps: a failed start leaves no folder behind, and --resume with --steps at or below the checkpoint is "
          "one line with both numbers, nothing written") {
  const fs::path root = temp_dir("failed_starts");
  const Run data = run_app("train_gan", "--data /nonexistent --out " + (root / "no_data").string());
  CHECK(data.status == 1);
  CHECK_FALSE(fs::exists(root / "no_data"));
  const Run resume = run_app("train_gan", "--resume --out " + (root / "no_ckpt").string());
  CHECK(resume.status == 1);
  CHECK(contains(resume.output, "--resume: no checkpoint at " + (root / "no_ckpt").string()));
  CHECK_FALSE(fs::exists(root / "no_ckpt"));

  const fs::path out = root / "done";
  REQUIRE(run_app("train_gan", small("train_gan", out, 3)).status == 0);
  const fs::path ckpt = out / "ckpt" / "latest.safetensors";
  const auto ckpt_time = fs::last_write_time(ckpt);
  const std::string metrics = read_text(out / "metrics.jsonl");
  for (const int64_t steps : {1, 3}) {
    CAPTURE(steps);
    const Run r = run_app("train_gan", small("train_gan", out, steps) + " --resume");
    CHECK(r.status == 2);
    CHECK(r.output == "train_gan: --resume: the checkpoint " + ckpt.string() + " is at step 3 and --steps is " +
                          std::to_string(steps) +
                          ": nothing to train (give --steps above 3, or --steps 0 to only evaluate) (run "
                          "'train_gan --help' for the options)\n");
  }
  CHECK(fs::last_write_time(ckpt) == ckpt_time);
  CHECK(read_text(out / "metrics.jsonl") == metrics);
  CHECK_FALSE(fs::exists(out / "samples_000001.png"));
  // --steps 0 only evaluates: the sample grid is the checkpoint's, named by its step.
  const Run eval = run_app("train_gan", small("train_gan", out, 0) + " --resume");
  INFO(eval.output);
  CHECK(eval.status == 0);
  CHECK(fs::exists(out / "samples_000003.png"));
  CHECK_FALSE(fs::exists(out / "samples_000000.png"));
}

TEST_CASE("apps: a metrics line that averages other than --log-every steps says how many (steps_averaged)") {
  const std::string env = "OMP_NUM_THREADS=1";
  const std::string args = "--ngf 8 --ndf 8 --batch-size 8 --sample-every 100000 --ckpt-every 2 --no-tensorboard";
  const fs::path each = temp_dir("every_step"), parts = temp_dir("avg_parts");
  REQUIRE(run_app("train_gan", args + " --steps 7 --log-every 1 --out " + each.string(), env).status == 0);
  REQUIRE(run_app("train_gan", args + " --steps 7 --log-every 4 --exit-after 2 --out " + parts.string(), env).status == 0);
  CHECK(read_lines(parts / "metrics.jsonl").empty());  // no log step before the exit
  const Run r = run_app("train_gan", args + " --steps 7 --log-every 4 --resume --out " + parts.string(), env);
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto steps = read_lines(each / "metrics.jsonl"), lines = read_lines(parts / "metrics.jsonl");
  REQUIRE(steps.size() == 7);
  REQUIRE(lines.size() == 2);
  auto value = [](const std::string& line, const std::string& key) {
    const size_t at = line.find("\"" + key + "\":");
    REQUIRE(at != std::string::npos);
    return std::stod(line.substr(at + key.size() + 3));
  };
  // Step 4 after a resume at 2: steps 3 and 4; step 7, the last: steps 5 to 7 (the lines
  // hold 9 digits).
  CHECK(lines[0].rfind("{\"step\":4,", 0) == 0);
  CHECK(value(lines[0], "steps_averaged") == 2);
  CHECK(lines[1].rfind("{\"step\":7,", 0) == 0);
  CHECK(value(lines[1], "steps_averaged") == 3);
  for (const char* key : {"loss_d", "loss_g"}) {
    CAPTURE(key);
    CHECK(value(lines[0], key) == doctest::Approx((value(steps[2], key) + value(steps[3], key)) / 2).epsilon(1e-8));
    CHECK(value(lines[1], key) ==
          doctest::Approx((value(steps[4], key) + value(steps[5], key) + value(steps[6], key)) / 3).epsilon(1e-8));
  }
  CHECK_FALSE(contains(steps[0], "steps_averaged"));  // a whole window of --log-every 1
}

TEST_CASE("apps: SIGINT / SIGTERM stop after the current step with a checkpoint, exit 130 / 143, and --resume "
          "continues to the uninterrupted result bit for bit") {
  // The whole run's steps: few enough to run twice, enough that the signal lands long
  // before the end (it is sent at step 2). The stop's line averages one step (--log-every 1),
  // so metrics.jsonl equals the uninterrupted run's too.
  constexpr int64_t kSteps = 120;
  const std::string env = "env OMP_NUM_THREADS=1 ";
  for (const auto& [app, signal] : {std::pair{std::string("train_gan"), SIGINT}, std::pair{std::string("train_joint"), SIGTERM}}) {
    CAPTURE(app);
    const fs::path parts = temp_dir("stopped_" + app), whole = temp_dir("whole_" + app);
    const std::string exe = (apps_dir() / app).string(), name = signal == SIGINT ? "SIGINT" : "SIGTERM";
    const fs::path log = temp_dir("logs") / (app + "_stopped.log");
    const int status = signalled_run(env + exe + " " + small(app, parts, kSteps), parts, {signal}, log);
    const std::string output = read_text(log);
    INFO(output);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 128 + signal);
    const fs::path ckpt = parts / "ckpt" / "latest.safetensors";
    REQUIRE(fs::exists(ckpt));
    const int64_t stopped = std::stoll(load_metadata(ckpt.string()).at("step"));
    CHECK(stopped >= 2);
    CHECK(last_step(parts / "metrics.jsonl") == stopped);
    CHECK(fs::exists(parts / "loss_curve.png"));
    CHECK(contains(output, app + ": got " + name + ": stopped after step " + std::to_string(stopped) +
                               " of " + std::to_string(kSteps) + ", checkpoint " + ckpt.string() + "\n"));
    const std::string resume = exe + " " + small(app, parts, kSteps) + " --resume";
    CHECK(contains(output, app + ": to continue: " + resume + "\n"));

    const Run r = run_logged(env + resume, temp_dir("logs") / (app + "_resumed.log"));
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(contains(r.output, "steps " + std::to_string(stopped + 1) + ".." + std::to_string(kSteps)));
    REQUIRE(run_app(app, small(app, whole, kSteps), "OMP_NUM_THREADS=1").status == 0);
    check_same_training(whole, parts, kSteps);
  }
}

TEST_CASE("apps: a second signal during the graceful stop ends the app at once (the signal's default action)") {
  // SIGINT, then 2 ms later SIGTERM, while the step that the first one lets finish runs.
  // Should the stop have been quicker than that (a starved machine), it is tried again.
  for (int attempt = 1;; ++attempt) {
    const fs::path out = temp_dir("twice");
    const int status = signalled_run((apps_dir() / "train_gan").string() + " " + small("train_gan", out, 100000), out,
                                     {SIGINT, SIGTERM}, temp_dir("logs") / "twice.log");
    if (WIFSIGNALED(status)) {
      CHECK(WTERMSIG(status) == SIGTERM);
      break;
    }
    MESSAGE("attempt ", attempt, ": the graceful stop ended before the second signal (exit ", WEXITSTATUS(status), ")");
    REQUIRE(attempt < 3);
  }
}

TEST_CASE("apps: under mpirun every rank refuses an --out that holds a run, with one message") {
  if (mpirun_missing()) return;
  const fs::path out = temp_dir("taken_2ranks");
  std::ofstream(out / "metrics.jsonl") << "{\"step\":1}\n";
  const Run r = run_logged("env OMP_NUM_THREADS=1 mpirun " + mpirun_test_options() + " -np 2 " +
                               (apps_dir() / "train_joint").string() + " --data /nonexistent --out " + out.string(),
                           temp_dir("logs") / "taken_2ranks.log");
  INFO(r.output);
  CHECK(r.status == 2);
  size_t messages = 0;
  for (size_t at = r.output.find("already holds a run"); at != std::string::npos;
       at = r.output.find("already holds a run", at + 1))
    ++messages;
  CHECK(messages == 1);
}
