// The training apps end to end, single rank: each built binary (build/apps/<name>,
// found next to this test's folder) runs a few tiny steps and writes metrics.jsonl,
// PNGs (decoded here by a minimal PNG reader) and a checkpoint; bad input is one clear
// line and a non-zero exit; --resume continues exactly (CPU: bit for bit).
// Multi-rank runs: tests/dist/apps_dist_test.cpp.
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "apps/app_runner.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing;

namespace {


int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Every "model.*" tensor of two checkpoints, compared exactly.
void check_same_models(const fs::path& a, const fs::path& b) {
  const TensorDict ta = load(a.string()), tb = load(b.string());
  int compared = 0;
  for (const auto& [name, t] : ta) {
    if (name.rfind("model.", 0) != 0) continue;
    CAPTURE(name);
    REQUIRE(tb.count(name));
    const auto va = nd::testing::to_vector(t), vb = nd::testing::to_vector(tb.at(name));
    CHECK(va == vb);
    ++compared;
  }
  CHECK(compared > 0);
}

// The event files SummaryWriter left in `dir` (not its sub-folders).
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) found.push_back(entry.path());
  return found;
}

// The number after "key": in a metrics line.
double metric(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  REQUIRE(at != std::string::npos);
  return std::stod(line.substr(at + key.size() + 3));
}

// The event file of a run read back: every metrics.jsonl number of the log steps as a
// scalar, the flags as text at step 0, the sample grid as an image, and (train_joint) the
// watched models' parameter histograms at the log steps.
void check_event_file(const fs::path& out, const std::string& app, const std::vector<std::string>& keys,
                      std::pair<int, int> sample_size) {
  const auto files = event_files(out);
  REQUIRE(files.size() == 1);
  const auto events = tensorboard::read_events(files[0].string());
  REQUIRE(events.size() > 1);
  CHECK(events[0].file_version == "brain.Event:2");
  std::map<std::pair<std::string, int64_t>, const tensorboard::Summary::Value*> by_tag;
  for (const auto& e : events)
    if (e.summary)
      for (const auto& v : e.summary->value) by_tag[{v.tag, e.step}] = &v;
  const auto lines = read_lines(out / "metrics.jsonl");
  for (const std::string& key : keys)
    for (const auto& [line, step] : {std::pair{lines[0], int64_t{2}}, std::pair{lines[1], int64_t{4}}}) {
      CAPTURE(key);
      CAPTURE(step);
      REQUIRE(by_tag.count({key, step}));
      REQUIRE(by_tag[{key, step}]->simple_value);
      CHECK(*by_tag[{key, step}]->simple_value == doctest::Approx(metric(line, key)).epsilon(1e-6));
    }
  REQUIRE(by_tag.count({"flags/text_summary", 0}));
  const auto& flags = by_tag[{"flags/text_summary", 0}]->tensor->string_val;
  REQUIRE(flags.size() == 1);
  CHECK(contains(flags[0], "| --steps | 4 |"));
  CHECK(contains(flags[0], "| --no-tensorboard | no |"));
  if (sample_size.first) {
    REQUIRE(by_tag.count({"samples", 4}));
    const auto& image = *by_tag[{"samples", 4}]->image;
    CHECK(std::pair{image.width, image.height} == sample_size);
    CHECK(image.colorspace == 1);
  }
  int histograms = 0;
  for (const auto& [tag_step, v] : by_tag)
    if (v->histo) {
      ++histograms;
      CHECK((tag_step.second == 2 || tag_step.second == 4));
      CHECK(v->histo->num > 0);
    }
  if (app == "train_joint") {
    for (const char* tag : {"G/", "D/", "MAE/"})
      CHECK(std::any_of(by_tag.begin(), by_tag.end(), [&](const auto& kv) {
        return kv.second->histo && kv.first.first.rfind(tag, 0) == 0 && kv.first.second == 2;
      }));
  } else {
    CHECK(histograms == 0);
  }
}

// An app's shared tiny settings.
std::string tiny(const fs::path& out) {
  return "--steps 4 --batch-size 8 --log-every 2 --sample-every 1000 --ckpt-every 2 --out " + out.string();
}

const char* kApps[] = {"train_gan", "train_mae", "train_joint", "train_classifier"};

}  // namespace

TEST_CASE("apps: --help lists the common flags and exits 0") {
  for (const char* app : kApps) {
    CAPTURE(app);
    const Run r = run_app(app, "--help");
    CHECK(r.status == 0);
    for (const char* flag : {"--device", "--steps", "--batch-size", "--lr", "--out", "--resume", "--seed", "--data",
                             "--log-every", "--sample-every", "--ckpt-every", "--amp", "--amp-dtype", "--no-tensorboard"})
      CHECK(contains(r.output, flag));
  }
  CHECK(contains(run_app("train_gan", "--help").output, "--sync-bn"));
  CHECK(contains(run_app("train_classifier", "--help").output, "--sync-bn"));
}

TEST_CASE("apps: bad flags are one line and exit status 2") {
  for (const char* app : kApps) {
    CAPTURE(app);
    Run r = run_app(app, "--stesp 3");
    CHECK(r.status == 2);
    CHECK(count_lines(r.output) == 1);
    CHECK(contains(r.output, "unknown option '--stesp'"));
    r = run_app(app, "--steps three");
    CHECK(r.status == 2);
    CHECK(contains(r.output, "--steps expects an integer"));
  }
  const Run r = run_app("train_gan", "--lr");
  CHECK(r.status == 2);
  CHECK(contains(r.output, "--lr needs a value"));
  const Run dtype = run_app("train_mae", "--amp --amp-dtype f8 --steps 1");
  CHECK(dtype.status == 2);
  CHECK(count_lines(dtype.output) == 1);
  CHECK(contains(dtype.output, "--amp-dtype: expected bf16 or f16, found 'f8'"));
  const Run alone = run_app("train_mae", "--amp-dtype f16 --steps 1");
  CHECK(alone.status == 2);
  CHECK(contains(alone.output, "--amp-dtype f16 needs --amp"));
  const Run rank = run_app("train_gan", "--powersgd-rank 4 --comm-hook bf16 --steps 1");
  CHECK(rank.status == 2);
  CHECK(count_lines(rank.output) == 1);
  CHECK(contains(rank.output, "--powersgd-rank 4 needs --comm-hook powersgd"));
  const Run zero = run_app("train_joint", "--zero --comm-hook powersgd --steps 1");
  CHECK(zero.status == 2);
  CHECK(count_lines(zero.output) == 1);
  CHECK(contains(zero.output, "--zero and --comm-hook powersgd cannot be combined"));
}

TEST_CASE("apps: --device cuda without a GPU is one clear line and a non-zero exit") {
  if (cuda::is_available()) {
    MESSAGE("SKIPPED: a GPU is present");
    return;
  }
  for (const char* app : kApps) {
    CAPTURE(app);
    const Run r = run_app(app, "--device cuda --steps 1");
    CHECK(r.status != 0);
    CHECK(count_lines(r.output) == 1);
    CHECK(contains(r.output, "cuda"));
  }
}

TEST_CASE("apps: a missing data folder or a corrupt IDX file is one clear line and a non-zero exit") {
  const fs::path missing = temp_dir("missing") / "nowhere";
  for (const char* app : kApps) {
    CAPTURE(app);
    const Run r = run_app(app, "--steps 1 --data " + missing.string() + " --out " + temp_dir("m_out").string());
    CHECK(r.status == 1);
    CHECK(count_lines(r.output) == 1);
    CHECK(contains(r.output, missing.string()));
  }
  // A truncated image file next to valid-looking labels: a wrong size, named.
  const fs::path corrupt = temp_dir("corrupt");
  for (const char* split : {"train", "t10k"}) {
    std::ofstream images(corrupt / (std::string(split) + "-images-idx3-ubyte"), std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28, 1, 2, 3};
    images.write(reinterpret_cast<const char*>(header), sizeof header);
    std::ofstream labels(corrupt / (std::string(split) + "-labels-idx1-ubyte"), std::ios::binary);
    const unsigned char lheader[] = {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0};
    labels.write(reinterpret_cast<const char*>(lheader), sizeof lheader);
  }
  for (const char* app : kApps) {
    CAPTURE(app);
    const Run r = run_app(app, "--steps 1 --data " + corrupt.string() + " --out " + temp_dir("c_out").string());
    CHECK(r.status == 1);
    CHECK(count_lines(r.output) == 1);
    CHECK(contains(r.output, "train-images-idx3-ubyte"));
  }
}

TEST_CASE("apps: each app trains a few steps and writes metrics.jsonl, PNGs and a checkpoint") {
  struct Case {
    const char* app;
    std::vector<std::string> keys;
    std::pair<int, int> sample_size;  // 0: no sample grid
  };
  // 8x8 tiles of 28 pixels with 2-pixel gaps; MAE: 6 columns (2 triplets) x 8 rows.
  const Case cases[] = {
      {"train_gan", {"loss_d", "loss_g", "update_norm_G", "update_norm_D", "steps_per_s"}, {8 * 30 + 2, 8 * 30 + 2}},
      {"train_mae", {"loss", "update_norm_MAE", "lr"}, {6 * 30 + 2, 8 * 30 + 2}},
      {"train_joint", {"loss_d", "loss_g", "loss_mae", "update_norm_G", "update_norm_D", "update_norm_MAE"},
       {8 * 30 + 2, 8 * 30 + 2}},
      {"train_classifier", {"loss", "batch_accuracy", "update_norm_classifier"}, {0, 0}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.app);
    const fs::path out = temp_dir(std::string("run_") + c.app);
    const std::string extra = std::string(c.app) == "train_classifier" ? " --test-images 200" : "";
    const Run r = run_app(c.app, tiny(out) + extra);
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto lines = read_lines(out / "metrics.jsonl");
    REQUIRE(lines.size() >= 2);
    CHECK(lines[0].rfind("{\"step\":2,", 0) == 0);
    CHECK(lines[0].back() == '}');
    for (const std::string& key : c.keys) CHECK(contains(lines[0], "\"" + key + "\":"));
    CHECK(contains(lines[1], "\"step\":4,"));
    CHECK(png_size(out / "loss_curve.png") == std::make_pair(800, 480));
    if (c.sample_size.first) CHECK(png_size(out / "samples_000004.png") == c.sample_size);
    CHECK(fs::exists(out / "ckpt" / "latest.safetensors"));
    CHECK(load_metadata((out / "ckpt" / "latest.safetensors").string()).at("step") == "4");
    check_event_file(out, c.app, c.keys, c.sample_size);
  }
  const fs::path off = temp_dir("no_tensorboard");
  REQUIRE(run_app("train_mae", tiny(off) + " --no-tensorboard").status == 0);
  CHECK(fs::exists(off / "metrics.jsonl"));
  CHECK(event_files(off).empty());
}

TEST_CASE("apps: --amp trains with bf16 (or f16) operands on the CPU too, close to but not equal to f32") {
  // The MAE is Linear layers, attention projections and attention; the DCGAN is
  // convolutions and transposed convolutions: under --amp every one of them changes.
  // --amp-dtype f16 adds the GradScaler, whose scale each metrics line reports.
  for (const auto& [app, key] : {std::pair{"train_mae", "\"loss\":"}, std::pair{"train_gan", "\"loss_d\":"}}) {
    CAPTURE(app);
    std::string first_line[3];
    const char* flags[] = {"", " --amp", " --amp --amp-dtype f16"};
    for (int amp = 0; amp < 3; ++amp) {
      const fs::path out = temp_dir(std::string(app) + "_amp" + std::to_string(amp));
      const Run r = run_app(app, tiny(out) + flags[amp]);
      INFO(r.output);
      REQUIRE(r.status == 0);
      const auto lines = read_lines(out / "metrics.jsonl");
      REQUIRE(lines.size() >= 2);
      first_line[amp] = lines[0];
      CHECK(contains(lines[0], "\"amp_scale\":") == (amp == 2));
    }
    auto loss = [key = std::string(key)](const std::string& line) {
      const size_t at = line.find(key);
      REQUIRE(at != std::string::npos);
      return std::stod(line.substr(at + key.size()));
    };
    const double f32 = loss(first_line[0]), bf16 = loss(first_line[1]), f16 = loss(first_line[2]);
    // A skipped first step (the initial scale overflowed: the GAN's D step does) changes
    // the second step's loss; then only the scale's halving is checked.
    const std::string scale_key = "\"amp_scale\":";
    const double scale = std::stod(first_line[2].substr(first_line[2].find(scale_key) + scale_key.size()));
    CHECK((scale == 65536 || scale == 32768 || scale == 16384));
    for (const double reduced : {bf16, f16}) {
      CHECK(std::isfinite(reduced));
      CHECK(reduced != f32);
      if (reduced == bf16 || scale == 65536) CHECK(std::abs(reduced - f32) < 0.02 * std::abs(f32));
    }
    CHECK(f16 != bf16);
  }
}

TEST_CASE("apps: train_gan --eval reports an FID with train_classifier's weights and train_mae --probe an accuracy") {
  const fs::path cls = temp_dir("classifier"), gan = temp_dir("gan_eval"), mae = temp_dir("mae_probe");
  REQUIRE(run_app("train_classifier", tiny(cls) + " --test-images 200").status == 0);
  const auto cls_lines = read_lines(cls / "metrics.jsonl");
  CHECK(contains(cls_lines.back(), "\"test_accuracy\":"));
  const Run r = run_app("train_gan", tiny(gan) + " --eval --eval-samples 100 --classifier " +
                                         (cls / "classifier.safetensors").string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  const std::string last = read_lines(gan / "metrics.jsonl").back();
  CHECK(contains(last, "\"fid\":"));
  CHECK_FALSE(contains(last, "\"fid\":null"));
  const Run p = run_app("train_mae", tiny(mae) + " --probe --probe-train 512");
  INFO(p.output);
  REQUIRE(p.status == 0);
  CHECK(contains(read_lines(mae / "metrics.jsonl").back(), "\"probe_accuracy\":"));
}

// One OpenMP thread, as each rank has under mpirun (the kernels are bit-reproducible at
// any fixed thread count: conv's weight gradient assigns chunks to threads statically).
TEST_CASE("apps: --resume after an interruption equals an uninterrupted run, bit for bit") {
  const std::string env = "OMP_NUM_THREADS=1";
  // The f16 GAN's first step overflows at the initial scale (skipped, scale halved): the
  // resumed run must continue from the checkpoint's GradScaler, not from a fresh one.
  for (const auto& [app, extra] : {std::pair{"train_gan", ""}, std::pair{"train_mae", ""},
                                   std::pair{"train_gan", " --amp --amp-dtype f16"}}) {
    CAPTURE(app);
    CAPTURE(extra);
    const std::string tag = std::string(app) + (*extra ? "_f16" : "");
    const fs::path whole = temp_dir("whole_" + tag), parts = temp_dir("parts_" + tag);
    const std::string args =
        std::string("--steps 5 --batch-size 8 --log-every 1 --sample-every 1000 --ckpt-every 2") + extra;
    REQUIRE(run_app(app, args + " --out " + whole.string(), env).status == 0);
    REQUIRE(run_app(app, args + " --exit-after 3 --out " + parts.string(), env).status == 0);
    CHECK(load_metadata((parts / "ckpt" / "latest.safetensors").string()).at("step") == "3");
    const Run r = run_app(app, args + " --resume --out " + parts.string(), env);
    INFO(r.output);
    REQUIRE(r.status == 0);
    check_same_models(whole / "ckpt" / "latest.safetensors", parts / "ckpt" / "latest.safetensors");
    // The resumed metrics continue the interrupted ones: steps 1..5 once each.
    const auto lines = read_lines(parts / "metrics.jsonl");
    REQUIRE(lines.size() >= 5);
    for (int s = 1; s <= 5; ++s) CHECK(contains(lines[s - 1], "{\"step\":" + std::to_string(s) + ","));
    // The resumed run's event file hides steps >= 4 (its first) of the interrupted one's.
    int purges = 0;
    for (const fs::path& file : event_files(parts)) {
      const auto events = tensorboard::read_events(file.string());
      if (events.size() < 3 || !events[2].session_log) continue;
      ++purges;
      CHECK(events[2].step == 4);
      CHECK(events[2].session_log->status == tensorboard::SessionLog::START);
    }
    CHECK(purges == 1);
  }
  const Run r = run_app("train_gan", "--steps 2 --resume --out " + temp_dir("no_ckpt").string());
  CHECK(r.status == 1);
  CHECK(contains(r.output, "--resume: no checkpoint at"));
}

TEST_CASE("apps: --resume with another global batch or seed is one clear error, the checkpoint untouched") {
  const fs::path out = temp_dir("resume_mismatch");
  const std::string args = "--steps 2 --batch-size 8 --seed 5 --log-every 1 --sample-every 1000 --ckpt-every 2";
  REQUIRE(run_app("train_gan", args + " --out " + out.string()).status == 0);
  const fs::path ckpt = out / "ckpt" / "latest.safetensors";
  const auto before = fs::last_write_time(ckpt);
  const Run batch = run_app("train_gan", "--steps 4 --batch-size 16 --seed 5 --resume --out " + out.string());
  CHECK(batch.status == 1);
  CHECK_MESSAGE(contains(batch.output, "was trained with --batch-size 8, this run has 16; use the same global batch"),
                batch.output);
  const Run seed = run_app("train_gan", "--steps 4 --batch-size 8 --seed 6 --resume --out " + out.string());
  CHECK(seed.status == 1);
  CHECK_MESSAGE(contains(seed.output, "was trained with --seed 5, this run has 6"), seed.output);
  CHECK(fs::last_write_time(ckpt) == before);
  CHECK(load_metadata(ckpt.string()).at("step") == "2");
}
