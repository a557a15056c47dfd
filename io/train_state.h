#pragma once
// Resumable training checkpoints: models, optimizers, schedulers, the step and the
// RNG state in one safetensors file (through nd::save / nd::load), so that
// "train N, save, load in a fresh process, train M" equals "train N + M" bit for bit.
//
// Keys: "model.<name>.<state_dict key>", "optim.<name>.<optimizer state key>",
// "sched.<name>.<scheduler state key>", "scaler.<name>.<GradScaler state key>",
// "state.<name>.<key>" (any other Stateful); metadata: "step", "rng.seed", "rng.offset",
// "world_size", plus whatever the caller adds.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/module.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/lr_scheduler.h"
#include "engine/optim/optimizer.h"

namespace nd {

// Anything else a resumed run must continue (a DDP communication hook's PowerSGDState):
// torch.distributed.checkpoint's Stateful protocol.
class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual TensorDict state_dict() const = 0;
  virtual void load_state_dict(const TensorDict& state) = 0;
};

struct TrainState {
  std::vector<std::pair<std::string, nn::Module*>> modules;
  std::vector<std::pair<std::string, optim::Optimizer*>> optimizers;
  std::vector<std::pair<std::string, optim::LRScheduler*>> schedulers;
  int64_t step = 0;
  std::vector<std::pair<std::string, optim::GradScaler*>> scalers;  // f16 loss scaling
  std::vector<std::pair<std::string, Stateful*>> stateful;
};

// Writes everything in `state` plus the default generator's state, atomically.
void save_train_state(const std::string& path, const TrainState& state,
                      const std::map<std::string, std::string>& metadata = {}, int64_t world_size = 1);
// The same in two parts, for a file one rank writes while a Stateful gathers from every
// rank (PowerSGD's per-rank error feedback): every rank collects, one rank saves.
TensorDict train_state_dict(const TrainState& state);
void save_train_state(const std::string& path, const TensorDict& collected, const TrainState& state,
                      const std::map<std::string, std::string>& metadata = {}, int64_t world_size = 1);
// Restores every model (onto each parameter's own device), optimizer, scheduler, Stateful
// (its tensors on the CPU, as saved) and the default generator; sets state.step. Every part named in `state` must be in the
// file (else an nd::Error names what is missing). Returns the file's metadata.
std::map<std::string, std::string> load_train_state(const std::string& path, TrainState& state);

}  // namespace nd
