#pragma once
// What every training app is told: the common flags (CommonOptions, add_common_flags) and
// the rank's place in the world. Tests: tests/apps/apps_test.cpp.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nanoddp.h>

#include "common/flags.h"

namespace app {

// --amp-dtype's values, in the order of kAmpDtypes.
enum class AmpDtype { kBf16, kF16 };
inline const std::vector<std::string> kAmpDtypes{"bf16", "f16"};
// --comm-hook's values, in the order of kCommHooks: f32 all-reduce, bf16 / fp16
// compression, PowerSGD.
enum class CommHook { kNone, kBf16, kFp16, kPowerSGD };
inline const std::vector<std::string> kCommHooks{"none", "bf16", "fp16", "powersgd"};

struct CommonOptions {
  std::string device = "cpu";
  int64_t steps = 1000;
  int64_t batch_size = 64;  // global: split evenly over the ranks
  double lr = 1e-3;
  std::string out;          // default out/<program>
  bool resume = false;
  bool overwrite = false;   // --overwrite: delete the run already in --out (holds_run) before writing
  int64_t seed = 0;
  std::string data = nd::data::kFashionMnistDir;
  int64_t log_every = 50;
  int64_t sample_every = 500;
  int64_t ckpt_every = 500;
  bool sync_bn = false;
  bool amp = false;
  std::optional<AmpDtype> amp_dtype;  // --amp-dtype (bf16 when not given)
  int64_t exit_after = 0;  // stop after this step, checkpoint written (as if killed); 0: off
  bool no_tensorboard = false;
  CommHook comm_hook = CommHook::kNone;  // --comm-hook (DDP communication hook)
  int64_t powersgd_rank = 1;       // --powersgd-rank: PowerSGD's matrix_approximation_rank
  bool zero = false;               // --zero: ZeroRedundancyOptimizer (optimizer state sharded over the ranks)
  // Set by add_common_flags: the Run asks which flags were given, the Logger writes their
  // values (TensorBoard's "flags" text), a stop prints the command line that resumes.
  const Flags* flags = nullptr;

  // Whether `step` ends with a checkpoint: every ckpt_every, the last and the exit step.
  bool checkpoint_at(int64_t step) const { return step % ckpt_every == 0 || step == steps || step == exit_after; }
};

// Adds --device --steps --batch-size --lr --out --resume --overwrite --seed --data --log-every
// --sample-every --ckpt-every --exit-after --amp --amp-dtype --no-tensorboard --comm-hook
// --powersgd-rank --zero, and --sync-bn when the app has BatchNorm.
void add_common_flags(Flags& flags, CommonOptions& options, bool has_batch_norm);

struct World {
  int rank = 0, size = 1;
  bool rank0() const { return rank == 0; }
  // The largest, smallest or sum of every rank's `value` (an all-reduce of one integer;
  // every rank calls it).
  int64_t max(int64_t value) const { return reduce(value, nd::dist::ReduceOp::MAX); }
  int64_t min(int64_t value) const { return reduce(value, nd::dist::ReduceOp::MIN); }
  int64_t sum(int64_t value) const { return reduce(value, nd::dist::ReduceOp::SUM); }
  int64_t reduce(int64_t value, nd::dist::ReduceOp op) const;
};
World world();

}  // namespace app
