#include "io/train_state.h"

#include "io/checkpoint.h"
#include "engine/error.h"
#include "engine/factories.h"

namespace nd {

namespace {
void put(TensorDict& out, const std::string& prefix, const TensorDict& part) {
  for (const auto& [key, t] : part) out[prefix + key] = t;
}

// The entries of `all` under `prefix`, with the prefix removed.
TensorDict take(const TensorDict& all, const std::string& prefix) {
  TensorDict out;
  for (auto it = all.lower_bound(prefix); it != all.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out[it->first.substr(prefix.size())] = it->second;
  return out;
}
}  // namespace

TensorDict train_state_dict(const TrainState& state) {
  TensorDict tensors;
  for (const auto& [name, m] : state.modules) put(tensors, "model." + name + ".", m->state_dict());
  for (const auto& [name, o] : state.optimizers) put(tensors, "optim." + name + ".", o->state_dict());
  for (const auto& [name, s] : state.schedulers) put(tensors, "sched." + name + ".", s->state_dict());
  for (const auto& [name, s] : state.scalers) put(tensors, "scaler." + name + ".", s->state_dict());
  for (const auto& [name, s] : state.stateful) put(tensors, "state." + name + ".", s->state_dict());
  return tensors;
}

void save_train_state(const std::string& path, const TensorDict& collected, const TrainState& state,
                      const std::map<std::string, std::string>& metadata, int64_t world_size) {
  std::map<std::string, std::string> meta = metadata;
  meta["step"] = std::to_string(state.step);
  meta["rng.seed"] = std::to_string(default_generator().seed);
  meta["rng.offset"] = std::to_string(default_generator().offset);
  meta["world_size"] = std::to_string(world_size);
  save(collected, path, meta);
}

void save_train_state(const std::string& path, const TrainState& state,
                      const std::map<std::string, std::string>& metadata, int64_t world_size) {
  save_train_state(path, train_state_dict(state), state, metadata, world_size);
}

std::map<std::string, std::string> load_train_state(const std::string& path, TrainState& state) {
  std::map<std::string, std::string> meta = load_metadata(path);
  for (const char* key : {"step", "rng.seed", "rng.offset"})
    ND_CHECK(meta.count(key), "load_train_state: ", path, " has no '", key,
             "' metadata; it is not a training checkpoint written by save_train_state");
  TensorDict all = load(path);
  auto require = [&](const std::string& prefix, const std::string& what) {
    TensorDict part = take(all, prefix);
    ND_CHECK(!part.empty(), "load_train_state: ", path, " holds no ", what, " (no keys under '", prefix, "')");
    return part;
  };
  for (auto& [name, m] : state.modules) m->load_state_dict(require("model." + name + ".", "model '" + name + "'"));
  for (auto& [name, o] : state.optimizers) {
    // A checkpoint saved before the first step has no optimizer state yet: nothing to restore.
    o->load_state_dict(take(all, "optim." + name + "."));
  }
  for (auto& [name, s] : state.schedulers)
    s->load_state_dict(require("sched." + name + ".", "scheduler '" + name + "'"));
  for (auto& [name, s] : state.scalers)  // a disabled scaler saves nothing and loads nothing
    if (s->is_enabled()) s->load_state_dict(require("scaler." + name + ".", "GradScaler '" + name + "'"));
  for (auto& [name, s] : state.stateful) s->load_state_dict(require("state." + name + ".", "state '" + name + "'"));
  state.step = std::stoll(meta.at("step"));
  default_generator() = Generator{std::stoull(meta.at("rng.seed")), std::stoull(meta.at("rng.offset"))};
  return meta;
}

}  // namespace nd
