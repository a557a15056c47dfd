// A workload's step at p GPUs: its CPU profile scaled to the GPU's compute time, its DDP buckets
// priced on a fabric (collective_cost.h) as the Reducer, the hook and ZeRO issue them, laid on
// the step's timeline (step_model.h).
//
// What each option sends per bucket of n gradient elements (e bytes each):
//   none      all-reduce of n e bytes, then the sum divided by p (2 n e bytes of memory traffic,
//             counted with the communication at the end of the step)
//   bf16/fp16 all-reduce of 2n bytes;
//             the hook's compute: 14 bytes of memory traffic per element at the launch (divide,
//             cast), 6 at the wait (cast back)
//   powersgd:r for each matrix gradient [a, b] (b = numel / a) with (a + b) r' 2 < a b,
//             r' = min(a, b, r): P (a r' elements) with the uncompressed rest while backward
//             goes on (two all-reduces), Q (b r') after the end of backward, in bucket order;
//             the hook's compute: 16 bytes of memory traffic per compressed element at the
//             launch (error feedback, M Q), 28 and 12 r per element of P and Q at the wait
//             (orthogonalising P, M^T P, P Q^T); the last bucket's status slots in an
//             all-reduce of their own
// The hooks' compute delays backward (step_model.h); DeviceModel::hook_cost, where set, gives
// it per bucket instead (scale_model --hook-cost measured: hook_cost.h).
//   zero 1    buckets all-reduced; the optimizer steps 1/p of the parameters, then an
//             all-gather of all parameters
//   zero 2    buckets reduce-scattered (the chunk copied back: 2 n e bytes of memory traffic);
//             status slots all-reduced apart; the same all-gather
// Every backward also pays DDP's 32-byte fingerprint all-reduce, and each model's buffers are
// broadcast once per backward that reaches it, one broadcast per dtype as the Reducer coalesces
// them (dist::plan_broadcasts; both counted as blocking; broadcast_buffers off: none).
#pragma once

#include <functional>
#include <string>

#include "scale_model/collective_cost.h"
#include "scale_model/step_model.h"
#include "scale_model/workload.h"

namespace nd::scale {

struct Options {
  double bucket_cap_mb = 25, first_bucket_cap_mb = 1;
  std::string hook = "none";  // none, bf16, fp16, powersgd
  int powersgd_rank = 0;
  int zero = 0;  // stage: 0 (off), 1, 2
  bool broadcast_buffers = true;  // DistributedDataParallelOptions::broadcast_buffers
  ScalarType grad_dtype = kFloat32;
  // "bucket 25MB, bf16, zero 2": the curve's name.
  std::string label() const;
};
// "none", "bf16", "fp16", "powersgd:R" into options.hook / powersgd_rank; nd::Error otherwise.
void parse_hook(const std::string& spec, Options& options);

// A hook's compute on one bucket, in seconds: at its call (before its first collective) and
// at the wait.
struct HookCost {
  double launch = 0, wait = 0;
};

struct DeviceModel {
  double time_scale = 1;            // profile seconds -> GPU seconds
  double memory_bandwidth = 3.35e12;  // bytes/s for the hooks' element-wise work (H100 SXM HBM3)
  // Where set: the hook's compute on one bucket (the model, its parameters' indices) as timed
  // on the CPU the profile ran on, scaled by time_scale as the profile is, instead of memory
  // traffic over memory_bandwidth.
  std::function<HookCost(const DdpModel&, const std::vector<size_t>&, const Options&)> hook_cost;
  // Seconds per step a DDP step waits for the slowest rank beyond the typical step (ranks
  // that are not equally fast; 0: all equal), at 2 GPUs or more; not scaled.
  double rank_skew = 0;
};

// One option set's buckets, priced at `gpus` ranks of `fabric`.
StepResult predict(const Workload& workload, const Profile& profile, const Options& options, const DeviceModel& device,
                   const Fabric& fabric, int gpus, Algorithm algorithm);

}  // namespace nd::scale
