// The models bench/scale_model predicts: their DDP models' parameters and buffers, one
// training step as the apps take it (train_gan: D's backward, D's step, G's backward through
// D, G's step; train_mae: one backward, AdamW), a CPU profile of that step (when each
// parameter's gradient became ready in each backward, where the backwards and the optimizer
// steps lie), and the buckets the Reducer builds from it (dist::plan_buckets, in the order the
// gradients became ready, as the Reducer's rebuild after the first iteration).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nanoddp.h>

namespace nd::scale {

struct DdpModel {
  std::string name;
  std::vector<Tensor> params;          // those that require grad, in registration order
  // What DDP broadcasts before a forward, one broadcast per dist::plan_broadcasts group (per dtype).
  std::vector<Tensor> buffers;
};

class Recorder;

struct Workload {
  std::string name;  // "dcgan28", "mae-tiny", "mae-mae_vit_base_patch16_dec512d8b", ...
  int64_t batch = 0;  // per GPU (the profile may run another: make_workload)
  std::vector<DdpModel> models;
  // One training step on the CPU (it holds the modules, optimizers and data); it calls
  // recorder.backward(loss) and recorder.optimizer(step).
  std::function<void(Recorder&)> step;
  // Where the parameters' gradient hooks report: the Recorder of the step being profiled.
  std::shared_ptr<Recorder*> sink;
};

// "dcgan<size>" for every models::DCGANConfig::by_name config (dcgan28: train_gan's default),
// "mae-<config>" for every models::MAEConfig::by_name config, with the apps' optimizers (Adam
// 2e-4, AdamW). batch 0: the apps' default (64, 128). profile_batch: the batch the CPU profile
// runs (0: batch), for models too large to profile at theirs. "shapes:PATH": a model we do not
// have, known by its parameters' and buffers' sizes only (a line each, in registration order:
// "param D0 D1 ..." or "buffer BYTES DTYPE", DTYPE as dtype_name writes it; '#' starts a comment), one DDP model without a step
// (synthetic_profile). Throws nd::Error naming the models, or the file's line that is wrong.
Workload make_workload(const std::string& name, int64_t batch, int64_t profile_batch = 0);
std::string workload_names();

// Times in seconds from the start of the step, medians over the profiled steps.
struct Profile {
  struct Ready {
    size_t model, param;
    double at;
  };
  struct Backward {
    double start = 0, end = 0;
    std::vector<Ready> ready;  // in the order the gradients became ready
  };
  double step = 0;
  std::vector<Backward> backwards;
  std::vector<std::pair<double, double>> optimizer;  // each optimizer step's [start, end]
};

// Runs `warmup` then `steps` steps of the workload on the CPU and takes the medians.
Profile profile_workload(Workload& workload, int steps, int warmup = 2);

// A step of 1 s for a workload without one (shapes:): forward, then a backward of
// `backward_fraction` of it that makes the gradients ready in reverse registration order (the
// Reducer's first-iteration order), spread by elements as spread_ready_by_bytes; no optimizer.
Profile synthetic_profile(const Workload& workload, double backward_fraction);

// The Recorder the workload's step reports to (profile_workload makes it).
class Recorder {
 public:
  void backward(const Tensor& loss);
  void optimizer(const std::function<void()>& step);
  // From the parameters' post-accumulate-grad hooks.
  void ready(size_t model, size_t param);

 private:
  friend Profile profile_workload(Workload&, int, int);
  double now() const;
  double t0_ = 0;
  Profile::Backward* current_ = nullptr;
  Profile run_;
};

// Instead of when they were measured, each backward's gradients ready at times spread over it in
// proportion to the elements made ready so far (in the measured order): scale_model --ready bytes.
void spread_ready_by_bytes(Profile& profile, const Workload& workload);

// Per bucket, the (parameter indices of) model `model`'s buckets as the Reducer builds them after
// its first iteration: in the order the gradients became ready in the first backward that
// reached the model, then the rest in reverse registration order. `dtype`: of the gradients.
std::vector<std::vector<size_t>> bucket_plan(const Workload& workload, const Profile& profile, size_t model,
                                             double bucket_cap_mb, double first_bucket_cap_mb, ScalarType dtype);

// The middle value of v (the upper one of an even count): the profile's and the hooks' timings.
double median(std::vector<double> v);

}  // namespace nd::scale
