#include "common/run_folder.h"

#include <filesystem>

namespace app {

namespace fs = std::filesystem;

bool holds_run(const std::string& dir) {
  return fs::exists(fs::path(dir) / "metrics.jsonl") || fs::exists(fs::path(dir) / "ckpt" / "latest.safetensors");
}

int remove_run(const std::string& folder) {
  const fs::path dir(folder);
  auto run_file = [](const std::string& name, bool in_ckpt) {
    auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
    auto ends = [&](const std::string& suffix) {
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (in_ckpt) return name == "latest.safetensors" || starts(".latest.safetensors.tmp.");
    return name == "metrics.jsonl" || name == "loss_curve.png" || name == "classifier.safetensors" ||
           (starts("samples_") && ends(".png")) || starts("events.out.tfevents.");
  };
  int removed = 0;
  for (const auto& [path, in_ckpt] : {std::pair{dir, false}, std::pair{dir / "ckpt", true}}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (!entry.is_regular_file() || !run_file(entry.path().filename().string(), in_ckpt)) continue;
      std::error_code rm;
      fs::remove(entry.path(), rm);
      ND_CHECK(!rm, "--overwrite: cannot delete ", entry.path().string(), ": ", rm.message());
      ++removed;
    }
  }
  std::error_code ec;
  if (fs::is_empty(dir / "ckpt", ec) && !ec) fs::remove(dir / "ckpt", ec);
  return removed;
}

namespace {
// `word` as a POSIX shell reads it: as it is when it is plain, else in single quotes.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789_./:=,+-@%") == std::string::npos;
  if (plain) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

std::string resume_command(const CommonOptions& o, const World& world) {
  std::string out = world.size > 1 ? "mpirun -np " + std::to_string(world.size) + " " : "";
  bool resume = false;
  const std::vector<std::string> words = o.flags ? o.flags->command_line() : std::vector<std::string>{};
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--overwrite") continue;
    resume = resume || words[i] == "--resume";
    out += (i ? " " : "") + shell_word(words[i]);
  }
  return resume ? out : out + " --resume";
}

std::string checkpoint_path(const CommonOptions& o) { return o.out + "/ckpt/latest.safetensors"; }

void save_checkpoint(const CommonOptions& o, const World& world, nd::TrainState& state, const BatchStream& batches) {
  const nd::TensorDict collected = nd::train_state_dict(state);  // every rank: PowerSGD gathers its errors
  if (!world.rank0()) return;
  std::error_code ec;
  fs::create_directories(fs::path(o.out) / "ckpt", ec);
  ND_CHECK(!ec, "cannot create the checkpoint folder ", o.out, "/ckpt: ", ec.message());
  nd::save_train_state(checkpoint_path(o), collected, state,
                       {{"batches_consumed", std::to_string(batches.consumed())},
                        {"epoch", std::to_string(batches.epoch())},
                        {"global_batch_size", std::to_string(o.batch_size)},
                        {"seed", std::to_string(o.seed)}},
                       world.size);
}

int64_t load_checkpoint(const CommonOptions& o, nd::TrainState& state, BatchStream& batches) {
  const std::string path = checkpoint_path(o);
  ND_CHECK(fs::exists(path), "--resume: no checkpoint at ", path, " (train without --resume first)");
  if (o.steps != 0) {
    const auto header = nd::load_metadata(path);
    const auto step = header.find("step");
    if (step != header.end() && std::stoll(step->second) >= o.steps)
      throw UsageError{"--resume: the checkpoint " + path + " is at step " + step->second + " and --steps is " +
                       std::to_string(o.steps) + ": nothing to train (give --steps above " + step->second +
                       ", or --steps 0 to only evaluate)"};
  }
  auto meta = nd::load_train_state(path, state);
  ND_CHECK(meta.count("batches_consumed") && meta.count("global_batch_size"), path,
           " was not written by a training app (no batches_consumed / global_batch_size metadata)");
  ND_CHECK(meta["global_batch_size"] == std::to_string(o.batch_size), "--resume: ", path, " was trained with --batch-size ",
           meta["global_batch_size"], ", this run has ", o.batch_size, "; use the same global batch");
  ND_CHECK(meta["seed"] == std::to_string(o.seed), "--resume: ", path, " was trained with --seed ", meta["seed"],
           ", this run has ", o.seed);
  batches.seek(std::stoll(meta["batches_consumed"]));
  return state.step;
}

}  // namespace app
