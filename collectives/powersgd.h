#pragma once
// PowerSGD gradient compression as a DDP communication hook (Vogels et al. 2019,
// https://arxiv.org/abs/1905.13727; PyTorch's powerSGD_hook, the per-tensor variant).
//
// For each gradient matrix M (a parameter's gradient viewed as [size(0), numel/size(0)])
// on every rank, with Q [m, r] shared by all ranks:
//   P = M Q  -> all-reduce (sum) -> orthogonalise P's columns (orthogonalize() below)
//   Q = M^T P -> all-reduce, / W  -> M ~ P Q^T, the rank-r approximation of the average.
// 1-D gradients (biases, norms) and matrices too small to gain min_compression_rate
// ((n + m) r * rate >= n m) are all-reduced uncompressed in one flat tensor. Error
// feedback adds what compression lost last time to this step's gradient; warm start
// reuses last step's Q (re-orthogonalised) instead of a fresh random one. Before
// start_powerSGD_iter iterations the hook is allreduce_hook.
//
// Where we differ from PyTorch (which keys its memories by bucket index): error feedback
// and Q are kept per parameter (by its name), so they survive DDP's bucket rebuild after
// the first iteration and a resumed run whose buckets start in a different order, and
// start_powerSGD_iter needs no lower bound; a fresh Q is drawn from a generator keyed by
// (random_seed, parameter name, iteration), the same on every rank and with nothing to
// checkpoint. Gram-Schmidt (r <= 2) re-orthogonalises each column, so that it too keeps
// full rank exact on a rank-deficient gradient; a zero column there becomes zero, not NaN
// (PyTorch's intent, without a host read). Overlap: the uncompressed and P all-reduces are
// issued while backward goes on; Q's, which needs P's result, when the Reducer waits for
// the bucket.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "collectives/comm_hooks.h"
#include "engine/nn/module.h"
#include "io/train_state.h"

namespace nd::dist {

struct PowerSGDOptions {
  PowerSGDOptions() = default;
  // Null: the DDP model's own group (GradBucket::process_group()).
  ND_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  // r: the lower, the stronger the compression (PyTorch suggests 1, 2, 4, ...).
  ND_ARG(int64_t, matrix_approximation_rank) = 1;
  // Iterations of plain all-reduce first (the start of training is the sensitive part).
  ND_ARG(int64_t, start_powerSGD_iter) = 1000;
  // Compress a matrix only when (n + m) r * min_compression_rate < n m.
  ND_ARG(double, min_compression_rate) = 2;
  ND_ARG(bool, use_error_feedback) = true;
  ND_ARG(bool, warm_start) = true;
  // Added to each column's norm before dividing (0: a zero column stays zero).
  ND_ARG(double, orthogonalization_epsilon) = 0;
  ND_ARG(uint64_t, random_seed) = 0;
  // Compress a bucket's gradients of one shape together (stacked: one batched matmul and
  // orthogonalisation per shape, PyTorch's option): the same result in fewer, larger
  // operations, for one stacked copy of them.
  ND_ARG(bool, batch_tensors_with_same_shape) = false;
};

// The hyperparameters and the state of one DDP model's PowerSGD. A Stateful: in the
// TrainState, "iter", "error.<parameter>" and "q.<parameter>" are saved and restored,
// so a resumed run continues exactly. Error feedback differs per rank: state_dict()
// all-gathers it into [world size, numel] rows (a collective once PowerSGD has run:
// every rank calls it, as nd::train_state_dict does; then one rank writes), and each
// rank takes back its own row at its first PowerSGD step after load_state_dict().
class PowerSGDState : public Stateful {
 public:
  explicit PowerSGDState(const PowerSGDOptions& options = {});
  const PowerSGDOptions& options() const { return options_; }
  // The settings every rank must share, for DDP's cross-rank check of the hook:
  // "matrix_approximation_rank 4, start_powerSGD_iter 100, min_compression_rate 2, ...".
  std::string describe() const;
  // Iterations seen so far (counted at each iteration's last bucket).
  int64_t iter() const { return iter_; }
  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& state) override;

 private:
  friend std::shared_ptr<FutureWork> powerSGD_hook(PowerSGDState* state, GradBucket& bucket);
  // At a PowerSGD step: remembers the group, and takes this rank's row of loaded errors.
  void take_loaded_errors(const std::shared_ptr<ProcessGroup>& group);
  PowerSGDOptions options_;
  int64_t iter_ = 0;
  std::shared_ptr<ProcessGroup> group_;       // the group of the last PowerSGD step
  std::map<std::string, Tensor> error_dict_;  // parameter name -> what compression lost here
  std::map<std::string, Tensor> loaded_errors_;  // [W, numel] per name, until the next step
  std::map<std::string, Tensor> q_memory_;    // parameter name -> Q [m, r] (warm start)
};

// PowerSGD's orthogonalisation (PyTorch's _orthogonalize), in place on `matrix`
// [rows, cols], cols <= rows: afterwards its columns are orthonormal and span at least
// the original columns' span, so P P^T M = M for any M whose columns P's spanned. Up to 2
// columns, and in bf16 / f16: Gram-Schmidt with re-orthogonalisation, each column divided
// by |c| + epsilon (a zero column stays zero). More columns: Householder QR (what
// torch.linalg.qr computes, LAPACK's signs; epsilon unused, as in PyTorch), whose Q is
// orthonormal whatever the matrix's rank: columns that the earlier ones already span
// (rounding noise after projection) are completed to an orthonormal basis instead of
// being normalised noise.
void orthogonalize(const Tensor& matrix, double epsilon);

// Registered as ddp.register_comm_hook(std::make_shared<PowerSGDState>(options), dist::powerSGD_hook).
std::shared_ptr<FutureWork> powerSGD_hook(PowerSGDState* state, GradBucket& bucket);
// "powerSGD_hook" for it, "a custom hook" for any other hook of a PowerSGDState.
std::string comm_hook_name(std::shared_ptr<FutureWork> (*hook)(PowerSGDState*, GradBucket&));

}  // namespace nd::dist
