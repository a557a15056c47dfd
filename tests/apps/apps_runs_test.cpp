// The apps' runs, single rank (and one 2-rank refusal): one run per --out folder (a second
// start is refused, exit 2, naming --resume and --overwrite; --overwrite deletes only the
// run's files), and failed starts leave no folder.
#include <filesystem>
#include <fstream>
#include <string>

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

TEST_CASE("apps: a failed start leaves no folder behind") {
  const fs::path root = temp_dir("failed_starts");
  const Run data = run_app("train_gan", "--data /nonexistent --out " + (root / "no_data").string());
  CHECK(data.status == 1);
  CHECK_FALSE(fs::exists(root / "no_data"));
  const Run resume = run_app("train_gan", "--resume --out " + (root / "no_ckpt").string());
  CHECK(resume.status == 1);
  CHECK(contains(resume.output, "--resume: no checkpoint at " + (root / "no_ckpt").string()));
  CHECK_FALSE(fs::exists(root / "no_ckpt"));

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
