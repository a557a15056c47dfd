// What a communication hook computes per bucket, measured on this machine's CPU: the library's
// own hook (collectives/comm_hooks.h, powersgd.h) run on one bucket of a model's real shapes in
// a group of one rank (its collectives the identity), so that only its compute is timed: the
// call (divide and cast; PowerSGD's error feedback and M Q) and the wait (the cast back;
// PowerSGD's Householder QR of P, M^T P and the decompression P Q^T). scale_model
// --hook-cost measured prices the hooks with it instead of GPU memory traffic.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "scale_model/predict.h"

namespace nd::scale {

// Medians over `reps` calls after two warm-up calls (PowerSGD's first call makes its Q), in
// seconds. The hook is options.hook ("bf16", "fp16", "powersgd" with options.powersgd_rank);
// "none" and ZeRO have no hook: nd::Error.
HookCost time_hook(const DdpModel& model, const std::vector<size_t>& members, const Options& options, int reps = 5);

// time_hook once per (model, bucket, hook), then from memory: DeviceModel::hook_cost.
class MeasuredHookCosts {
 public:
  HookCost operator()(const DdpModel& model, const std::vector<size_t>& members, const Options& options);

 private:
  std::map<std::tuple<std::string, std::vector<size_t>, std::string, int>, HookCost> seen_;
};

}  // namespace nd::scale
