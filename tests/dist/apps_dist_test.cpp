// The training apps under mpirun. This binary runs alone and under mpirun -np 2 / 4
// (tests/CMakeLists.txt); rank 0 does the work and the other ranks only join the job.
// Rank 0 launches the apps itself, as a user would: `mpirun -np W <app>` with
// W = this job's world size (2 when run alone), and `<app>` alone as the 1-rank
// reference. Its children get an environment without this job's OMPI_* / PMIX_*
// variables, so each is a fresh, independent MPI job rather than a stray member of
// this one (OpenMPI mistakes a child that inherits them for a rank of the parent job).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "apps/app_runner.h"
#include "data/data_test_util.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing;

extern char** environ;

namespace {

int rank() { return dist::world()->rank(); }
int64_t ranks_to_launch() { return std::max(2, dist::world()->size()); }


// "env -u A -u B ..." dropping every variable of the launcher of this job.
std::string clean_env() {
  std::string out = "env";
  for (char** e = environ; *e; ++e) {
    const std::string var = *e;
    const std::string name = var.substr(0, var.find('='));
    for (const char* prefix : {"OMPI_", "PMIX_", "OPAL_", "ORTE_", "PMI_", "HYDRA_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID"})
      if (name.rfind(prefix, 0) == 0) {
        out += " -u " + name;
        break;
      }
  }
  return out;
}

// np == 0: the app alone; else under mpirun -np np. One OpenMP thread per process (see
// mpirun_test_options()).
Run launch(int64_t np, const std::string& app, const std::string& args) {
  const fs::path log = temp_dir("logs") / (app + "_" + std::to_string(np) + ".log");
  std::string cmd = clean_env() + " OMP_NUM_THREADS=1 ";
  if (np > 0)
    cmd += "mpirun " + mpirun_test_options() + " -np " + std::to_string(np) + " ";
  cmd += (apps_dir() / app).string() + " " + args;
  return run_logged(cmd, log);
}

// The number after "key": in a metrics line.
double value_of(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  REQUIRE(at != std::string::npos);
  return std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

bool skip() { return mpirun_missing() || rank() != 0; }  // only rank 0 launches

const std::string kJoint = "--batch-size 8 --log-every 1 --sample-every 1000 --ckpt-every 2 --lr 1e-3";

}  // namespace

TEST_CASE("apps under mpirun: train_joint trains every parameter of G, D and the MAE every step, "
          "and W ranks equal 1 rank on the same global batch") {
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  const fs::path multi = temp_dir("joint_multi"), single = temp_dir("joint_single");
  const Run m = launch(W, "train_joint", kJoint + " --steps 3 --out " + multi.string());
  INFO(m.output);
  REQUIRE(m.status == 0);
  CHECK(contains(m.output, "train_joint: " + std::to_string(W) + " rank(s)"));
  const Run s = launch(0, "train_joint", kJoint + " --steps 3 --out " + single.string());
  INFO(s.output);
  REQUIRE(s.status == 0);

  const auto lines = read_lines(multi / "metrics.jsonl");
  REQUIRE(lines.size() >= 3);
  for (int step = 1; step <= 3; ++step) {
    const std::string& line = lines[step - 1];
    CAPTURE(line);
    REQUIRE(contains(line, "{\"step\":" + std::to_string(step) + ","));
    for (const char* model : {"G", "D", "MAE"}) {
      CHECK(value_of(line, std::string("update_norm_") + model) > 0);
      CHECK(value_of(line, std::string("unchanged_params_") + model) == 0);  // every parameter moved
    }
  }
  // Same global batch, same noise per sample: equal up to float rounding (the
  // reduction order of gradients and SyncBatchNorm statistics differs).
  check_same_models(multi / "ckpt" / "latest.safetensors", single / "ckpt" / "latest.safetensors", 1e-4);
  CHECK(png_size(multi / "loss_curve.png") == std::make_pair(800, 480));  // rank 0 wrote a whole PNG
}

TEST_CASE("apps under mpirun: a run stopped after a checkpoint and resumed equals an uninterrupted one") {
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  const fs::path whole = temp_dir("resume_whole"), parts = temp_dir("resume_parts");
  REQUIRE(launch(W, "train_joint", kJoint + " --steps 4 --out " + whole.string()).status == 0);
  REQUIRE(launch(W, "train_joint", kJoint + " --steps 4 --exit-after 2 --out " + parts.string()).status == 0);
  CHECK(load_metadata((parts / "ckpt" / "latest.safetensors").string()).at("step") == "2");
  const Run r = launch(W, "train_joint", kJoint + " --steps 4 --resume --out " + parts.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  check_same_models(whole / "ckpt" / "latest.safetensors", parts / "ckpt" / "latest.safetensors", 0.0);
}

TEST_CASE("apps under mpirun: --comm-hook powersgd stopped and resumed equals an uninterrupted run") {
  // PowerSGD from the first step (a tenth of --steps 4 is 0): the checkpoint must carry every
  // rank's error feedback and the Q of G, D and the MAE for the resumed run to match.
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  const std::string args = kJoint + " --steps 4 --comm-hook powersgd --powersgd-rank 2 --out ";
  const fs::path whole = temp_dir("powersgd_whole"), parts = temp_dir("powersgd_parts");
  REQUIRE(launch(W, "train_joint", args + whole.string()).status == 0);
  REQUIRE(launch(W, "train_joint", args + parts.string() + " --exit-after 2").status == 0);
  int64_t errors = 0;
  for (const auto& [key, t] : load((parts / "ckpt" / "latest.safetensors").string()))
    if (key.rfind("state.powersgd.D.error.", 0) == 0) {
      CHECK(t.size(0) == W);  // one row per rank
      ++errors;
    }
  CHECK(errors > 0);
  const Run r = launch(W, "train_joint", args + parts.string() + " --resume");
  INFO(r.output);
  REQUIRE(r.status == 0);
  check_same_models(whole / "ckpt" / "latest.safetensors", parts / "ckpt" / "latest.safetensors", 0.0);
}

TEST_CASE("apps under mpirun: --zero trains as plain DDP does, and its checkpoint resumes at 1 rank with or "
          "without --zero") {
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  const std::string args = kJoint + " --steps 4 --out ";
  const fs::path plain = temp_dir("zero_plain"), zero = temp_dir("zero_whole"), parts = temp_dir("zero_parts");
  REQUIRE(launch(W, "train_joint", args + plain.string()).status == 0);
  const Run z = launch(W, "train_joint", args + zero.string() + " --zero");
  INFO(z.output);
  REQUIRE(z.status == 0);
  // Adam and AdamW are elementwise: stepping each rank's shard is stepping the whole.
  check_same_models(plain / "ckpt" / "latest.safetensors", zero / "ckpt" / "latest.safetensors", 0.0);
  // The checkpoint holds the whole optimizer state (one rank's file), as the plain run's does.
  const TensorDict saved = load((zero / "ckpt" / "latest.safetensors").string()),
                   unsharded = load((plain / "ckpt" / "latest.safetensors").string());
  for (const auto& [key, t] : unsharded)
    if (key.rfind("optim.", 0) == 0) {
      REQUIRE(saved.count(key));
      check_close(saved.at(key), t, 0.0, 0.0, key);
    }
  // Stopped at W ranks, resumed at 1 (with and without --zero) and, from 4 ranks, at 2: equal
  // to the W-rank run up to float rounding (the reduction order of gradients and SyncBatchNorm
  // statistics differs).
  std::vector<std::pair<int64_t, std::string>> resumes{{0, " --zero"}, {0, ""}};
  if (W >= 4) resumes.emplace_back(W / 2, " --zero");
  for (const auto& [np, resume_flags] : resumes) {
    CAPTURE(np);
    CAPTURE(resume_flags);
    fs::remove_all(parts);
    REQUIRE(launch(W, "train_joint", args + parts.string() + " --zero --exit-after 2").status == 0);
    const Run r = launch(np, "train_joint", args + parts.string() + " --resume" + resume_flags);
    INFO(r.output);
    REQUIRE(r.status == 0);
    check_same_models(zero / "ckpt" / "latest.safetensors", parts / "ckpt" / "latest.safetensors", 1e-4);
  }
  // f16 autocast with its GradScaler: the same checkpoint with and without --zero (every
  // rank's scaler sees the same verdict on ZeRO's reduce-scattered gradients).
  const fs::path f16_plain = temp_dir("zero_f16_plain"), f16_zero = temp_dir("zero_f16");
  REQUIRE(launch(W, "train_joint", args + f16_plain.string() + " --amp --amp-dtype f16").status == 0);
  REQUIRE(launch(W, "train_joint", args + f16_zero.string() + " --amp --amp-dtype f16 --zero").status == 0);
  const TensorDict f16_a = load((f16_plain / "ckpt" / "latest.safetensors").string()),
                   f16_b = load((f16_zero / "ckpt" / "latest.safetensors").string());
  REQUIRE(f16_a.size() == f16_b.size());
  for (const auto& [key, t] : f16_a) {
    REQUIRE(f16_b.count(key));
    check_close(f16_b.at(key), t, 0.0, 0.0, key);
  }
}

TEST_CASE("apps under mpirun: every app runs a few steps and rank 0 writes metrics, PNGs and a checkpoint") {
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  for (const char* app : {"train_gan", "train_mae", "train_classifier"}) {
    CAPTURE(app);
    const fs::path out = temp_dir(std::string("each_") + app);
    std::string args = "--steps 2 --batch-size 8 --log-every 1 --sample-every 2 --ckpt-every 2 --out " + out.string();
    if (std::string(app) != "train_mae") args += " --sync-bn";
    if (std::string(app) == "train_classifier") args += " --test-images 100";
    const Run r = launch(W, app, args);
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(contains(r.output, std::string(app) + ": " + std::to_string(W) + " rank(s)"));
    const auto lines = read_lines(out / "metrics.jsonl");
    REQUIRE(lines.size() >= 2);
    CHECK(contains(lines[1], "{\"step\":2,"));
    // The same images as a 1-rank run: 800 x 480 loss curve; 8 x 8 tiles of 28 pixels with
    // 2-pixel gaps (MAE: 2 triplets of columns x 8 rows); the classifier draws no samples.
    CHECK(png_size(out / "loss_curve.png") == std::make_pair(800, 480));
    if (std::string(app) == "train_gan") CHECK(png_size(out / "samples_000002.png") == std::make_pair(242, 242));
    if (std::string(app) == "train_mae") CHECK(png_size(out / "samples_000002.png") == std::make_pair(182, 242));
    CHECK(fs::exists(out / "ckpt" / "latest.safetensors"));
    CHECK(load_metadata((out / "ckpt" / "latest.safetensors").string()).at("world_size") == std::to_string(W));
  }
}

TEST_CASE("apps under mpirun: a batch size that does not divide by the world size is one clear error") {
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  const Run r = launch(W, "train_gan", "--steps 1 --batch-size " + std::to_string(W + 1) + " --out " +
                                           temp_dir("bad_batch").string());
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "--batch-size " + std::to_string(W + 1) + " does not divide by the world size " +
                               std::to_string(W)));
}

namespace {
// train_gan on a generated folder (50 PNGs and JPEGs of 20-40 px in 2 classes: 6 batches
// of 8 an epoch) at 32x32 RGB; the flags before --out.
std::string image_gan_args(const fs::path& images) {
  make_image_folder(images, 48);
  return "--data " + images.string() +
         " --image-size 32 --workers 2 --sync-bn --batch-size 8 --nz 16 --ngf 8 --ndf 8 --lr 1e-3 "
         "--log-every 1 --sample-every 8 --ckpt-every 100 --no-tensorboard --steps 8 --out ";
}
}  // namespace

TEST_CASE("apps under mpirun: train_gan on a folder of PNGs and JPEGs at 32x32 RGB: W ranks equal 1 rank, "
          "a resume mid-epoch equals the uninterrupted run") {
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  const fs::path images = temp_dir("gan_images");
  const std::string args = image_gan_args(images);
  const fs::path multi = temp_dir("gan_images_multi"), single = temp_dir("gan_images_single");
  const Run m = launch(W, "train_gan", args + multi.string());
  INFO(m.output);
  REQUIRE(m.status == 0);
  CHECK(contains(m.output, "ImageFolder in " + images.string() + " (50 images, 2 classes) at 32x32x3"));
  CHECK(png_size(multi / "samples_000008.png") == std::make_pair(274, 274));  // 8 x 8 tiles of 32 px
  const auto weights = load((multi / "ckpt" / "latest.safetensors").string());
  CHECK(weights.at("model.D.main.0.weight").sizes() == Shape{8, 3, 4, 4});  // dcgan32's stack on RGB
  CHECK(weights.at("model.G.main.0.weight").sizes() == Shape{16, 32, 4, 4});
  const Run s = launch(0, "train_gan", args + single.string());
  INFO(s.output);
  REQUIRE(s.status == 0);
  check_same_models(multi / "ckpt" / "latest.safetensors", single / "ckpt" / "latest.safetensors", 1e-4);

  // Stopped after step 3 (mid-epoch), resumed with other --workers: the same bits.
  const fs::path parts = temp_dir("gan_images_parts");
  REQUIRE(launch(W, "train_gan", args + parts.string() + " --exit-after 3").status == 0);
  const Run r = launch(W, "train_gan", args + parts.string() + " --resume --workers 3");
  INFO(r.output);
  REQUIRE(r.status == 0);
  check_same_models(multi / "ckpt" / "latest.safetensors", parts / "ckpt" / "latest.safetensors", 0.0);
}

TEST_CASE("apps under mpirun: an unreadable image file ends the job naming it, or --skip-unreadable lists it") {
  if (skip()) return;
  const int64_t W = ranks_to_launch();
  const fs::path images = temp_dir("gan_images_bad");
  const std::string args = image_gan_args(images);
  const Bytes jpeg = data::read_file((images / "a" / "j420.jpg").string());
  write_bytes((images / "b" / "cut.jpg").string(), Bytes(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2)));
  const std::string bad =
      "decode_image: '" + (images / "b" / "cut.jpg").string() + "': not a valid JPEG: Premature end of JPEG file";
  // The rank that reads it stops; mpirun ends the others (which wait in a collective for it).
  const Run failed = launch(W, "train_gan", args + temp_dir("gan_images_failed").string() + " --steps 14");
  INFO(failed.output);
  CHECK(failed.status == 1);
  CHECK(contains(failed.output, "train_gan: error: " + bad));
  const Run skipped =
      launch(W, "train_gan", args + temp_dir("gan_images_skip").string() + " --steps 14 --skip-unreadable");
  INFO(skipped.output);
  CHECK(skipped.status == 0);
  CHECK(contains(skipped.output, " left out 1 unreadable file(s):\n  " + bad));
}
