#include "engine/nn/clip_grad.h"

#include <cmath>
#include <string>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/index.h"
#include "engine/ops/reduce.h"

namespace nd::nn::utils {

namespace {

// The gradients of `parameters` that exist, checked to be floating and on one device.
std::vector<Tensor> gradients(const char* op, const std::vector<Tensor>& parameters) {
  std::vector<Tensor> out;
  for (const Tensor& p : parameters) {
    ND_CHECK(p.defined(), op, ": a parameter is an undefined tensor");
    if (!p.impl().grad) continue;
    const Tensor g = p.grad();
    ND_CHECK(g.is_floating_point(), op, ": expected floating point gradients, found ", g.describe(), " of ",
             p.describe());
    ND_CHECK(out.empty() || g.device() == out.front().device(), op,
             ": expected every gradient on one device, found ", out.front().describe(), " and ", g.describe(), " of ",
             p.describe());
    out.push_back(g);
  }
  return out;
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  const char* op = "clip_grad_norm_";
  ND_CHECK(norm_type > 0 && !std::isnan(norm_type), op, ": expected norm_type > 0 (or infinity), found ", norm_type);
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(op, parameters);
  if (grads.empty()) return scalar_tensor(0.0);
  // The norm_type-norm of the values of a (all >= 0): of each |g|, then of the per-gradient norms.
  const auto norm_of = [norm_type](const Tensor& a) {
    if (std::isinf(norm_type)) return a.numel() ? max(a) : zeros({}, a.options());
    if (norm_type == 2.0) return sum(a * a).sqrt();
    if (norm_type == 1.0) return sum(a);
    return sum(a.pow(norm_type)).pow(1.0 / norm_type);
  };
  std::vector<Tensor> norms;  // per gradient, 0-d, in the first gradient's dtype
  for (const Tensor& g : grads) norms.push_back(norm_of(g.abs()).to(grads.front().dtype()));
  const Tensor total = norm_of(stack(norms));
  if (error_if_nonfinite) {
    const double t = total.item();
    ND_CHECK(std::isfinite(t), op, ": the total norm of order ", norm_type, " of the gradients is ", t,
             ", so they cannot be clipped. Pass error_if_nonfinite = false to scale them by the non-finite norm "
             "anyway (under a GradScaler, unscale_ first: its step() skips a non-finite step by itself).");
  }
  // min(1, max_norm / (total + 1e-6)), applied to every gradient (as PyTorch, also when 1).
  const Tensor coef = clamp(max_norm / (total + 1e-6), -std::numeric_limits<double>::infinity(), 1.0);
  for (const Tensor& g : grads) g.mul_(coef.to(g.dtype()));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  const char* op = "clip_grad_value_";
  ND_CHECK(clip_value >= 0, op, ": expected clip_value >= 0, found ", clip_value);
  NoGradGuard no_grad;
  for (const Tensor& g : gradients(op, parameters)) g.clamp_(-clip_value, clip_value);
}

}  // namespace nd::nn::utils
