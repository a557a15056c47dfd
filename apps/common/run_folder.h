#pragma once
// What a run keeps in its --out folder DIR: whether DIR holds a run, deleting one
// (--overwrite), the checkpoint DIR/ckpt/latest.safetensors (written atomically by rank 0
// through save_train_state, with the batch stream's position and the world size in its
// metadata) and the command line that resumes. Tests: tests/apps/apps_test.cpp,
// tests/apps/apps_runs_test.cpp.
#include <cstdint>
#include <string>

#include <nanoddp.h>

#include "common/batches.h"
#include "common/options.h"

namespace app {

// Whether folder `dir` holds a run: it has DIR/metrics.jsonl or DIR/ckpt/latest.safetensors.
bool holds_run(const std::string& dir);
// The files a run writes into `dir` (metrics.jsonl, loss_curve.png, samples_*.png, the
// event files, classifier.safetensors, ckpt/latest.safetensors and its temp files), removed
// by --overwrite, and ckpt/ when that leaves it empty; nothing else. Returns how many.
int remove_run(const std::string& dir);

std::string checkpoint_path(const CommonOptions& options);
void save_checkpoint(const CommonOptions& options, const World& world, nd::TrainState& state,
                     const BatchStream& batches);
// Loads the checkpoint into `state` (every rank), seeks the batch stream and returns
// the step to continue from. Throws nd::Error when there is none, UsageError when --steps
// is not 0 (only evaluate) and not above the checkpoint's step (nothing loaded then).
int64_t load_checkpoint(const CommonOptions& options, nd::TrainState& state, BatchStream& batches);

// The command line that continues this run: this one without --overwrite, with --resume
// (under mpirun prefixed with "mpirun -np W", the other mpirun options being unknown here).
std::string resume_command(const CommonOptions& options, const World& world);

}  // namespace app
