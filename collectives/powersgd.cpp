#include "collectives/powersgd.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/index.h"

namespace nd::dist {

PowerSGDState::PowerSGDState(const PowerSGDOptions& options) : options_(options) {
  ND_CHECK(options_.matrix_approximation_rank() >= 1, "PowerSGDState: expected matrix_approximation_rank >= 1, found ",
           options_.matrix_approximation_rank());
  ND_CHECK(options_.start_powerSGD_iter() >= 0, "PowerSGDState: expected start_powerSGD_iter >= 0, found ",
           options_.start_powerSGD_iter());
  ND_CHECK(options_.min_compression_rate() >= 0 && options_.orthogonalization_epsilon() >= 0,
           "PowerSGDState: expected min_compression_rate >= 0 and orthogonalization_epsilon >= 0, found ",
           options_.min_compression_rate(), " and ", options_.orthogonalization_epsilon());
}

std::string PowerSGDState::describe() const {
  const PowerSGDOptions& o = options_;
  std::ostringstream s;
  s << std::boolalpha << "matrix_approximation_rank " << o.matrix_approximation_rank() << ", start_powerSGD_iter "
    << o.start_powerSGD_iter() << ", min_compression_rate " << o.min_compression_rate() << ", use_error_feedback "
    << o.use_error_feedback() << ", warm_start " << o.warm_start() << ", orthogonalization_epsilon "
    << o.orthogonalization_epsilon() << ", random_seed " << o.random_seed() << ", batch_tensors_with_same_shape "
    << o.batch_tensors_with_same_shape();
  return s.str();
}

TensorDict PowerSGDState::state_dict() const {
  TensorDict out;
  out["iter"] = full({1}, static_cast<double>(iter_), kInt64);
  for (const auto& [name, rows] : loaded_errors_) out["error." + name] = rows;  // not used since loaded
  for (const auto& [name, e] : error_dict_) {
    const int W = group_->size();
    const Tensor flat = e.reshape({e.numel()});
    std::vector<Tensor> rows;
    for (int r = 0; r < W; ++r) rows.push_back(empty({e.numel()}, e.options()));
    if (W > 1)
      group_->allgather(rows, flat)->wait();
    else
      rows[0].copy_(flat);
    out["error." + name] = stack(rows);
  }
  for (const auto& [name, q] : q_memory_) out["q." + name] = q;
  return out;
}

void PowerSGDState::load_state_dict(const TensorDict& state) {
  auto it = state.find("iter");
  ND_CHECK(it != state.end() && it->second.numel() == 1, "PowerSGDState::load_state_dict: expected an 'iter' entry ",
           "(a state saved by PowerSGDState::state_dict), found ", state.size(), " entries without it");
  error_dict_.clear();
  loaded_errors_.clear();
  q_memory_.clear();
  iter_ = static_cast<int64_t>(it->second.item());
  for (const auto& [key, t] : state) {
    if (key.rfind("error.", 0) == 0)
      loaded_errors_[key.substr(6)] = t;
    else if (key.rfind("q.", 0) == 0)
      q_memory_[key.substr(2)] = t;
    else
      ND_CHECK(key == "iter", "PowerSGDState::load_state_dict: unexpected entry '", key,
               "'; expected 'iter', 'error.<parameter>' and 'q.<parameter>'");
  }
}

void PowerSGDState::take_loaded_errors(const std::shared_ptr<ProcessGroup>& group) {
  group_ = group;
  for (const auto& [name, rows] : loaded_errors_) {
    ND_CHECK(rows.dim() == 2 && rows.size(0) == group->size(), "PowerSGDState: the error feedback of '", name,
             "' was saved by ", rows.dim() == 2 ? rows.size(0) : 0, " rank(s) (", rows.describe(), "), this run has ",
             group->size(), "; resume PowerSGD with the world size it was saved with");
    error_dict_[name] = rows.select(0, group->rank()).clone();
  }
  loaded_errors_.clear();
}

namespace {

// FNV-1a: the same on every rank and every run (std::hash promises neither).
uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  return h;
}

// Modified Gram-Schmidt on the rows of each t[i] ([batch, cols, rows]: the matrices'
// columns, made contiguous), in place: each column is projected off the finished ones once
// more (re-orthogonalisation: rounding noise left by the first projection, all that remains
// of a column the ones before it already span, is made orthogonal too), normalised,
// c <- c / (|c| + eps), and removed from the columns after it, r <- r - (c . r) c. A zero
// column (eps = 0) stays zero instead of becoming NaN, without reading the norm on the host.
void gram_schmidt(const Tensor& t, double epsilon) {
  const int64_t cols = t.size(1);
  for (int64_t i = 0; i < cols; ++i) {
    const Tensor col = t.narrow(1, i, 1);  // [batch, 1, rows]
    if (i > 0) {
      const Tensor done = t.narrow(1, 0, i);  // [batch, i, rows]
      col.sub_(col.matmul(done.transpose(1, 2)).matmul(done));
    }
    const Tensor norm = col.pow(2).sum({2}, true).sqrt();  // [batch, 1, 1]
    const Tensor nonzero = norm.gt(0).to(t.dtype());
    col.mul_(nonzero / (norm + epsilon + (1.0 - nonzero)));
    if (i + 1 == cols) break;
    const Tensor rest = t.narrow(1, i + 1, cols - i - 1);   // [batch, k, rows]
    rest.sub_(rest.matmul(col.transpose(1, 2)) * col);      // [batch, k, 1] * [batch, 1, rows]
  }
}

// Householder QR of each matrix whose columns are the rows of t[i] ([batch, cols, rows]);
// `t` is overwritten with Q's columns. LAPACK's geqr2 and org2r (what torch.linalg.qr
// runs): for column k, x = A[k:, k] is reflected onto beta e_1 with beta = -sign(x_0) |x|
// by H_k = I - 2 v v^T / (v^T v), v = x - beta e_1 (H_k = I when x_1.. are zero), applied
// to the columns after it; then Q = H_0 ... H_{cols-1} I[:, :cols]. Q is orthonormal
// whatever A's rank: where A is rank-deficient its last columns complete the basis.
void householder_qr(const Tensor& t) {
  const int64_t cols = t.size(1), rows = t.size(2);
  std::vector<Tensor> vs, coefs;  // v_k [batch, 1, rows - k] and 2 / (v^T v) (0 where H_k = I)
  for (int64_t k = 0; k < cols; ++k) {
    const Tensor x = t.narrow(1, k, 1).narrow(2, k, rows - k);  // [batch, 1, rows - k]
    const Tensor alpha = x.narrow(2, 0, 1);                       // [batch, 1, 1]
    const Tensor tail_sq = x.narrow(2, 1, rows - k - 1).pow(2).sum({2}, true);
    const Tensor sign = 1.0 - alpha.lt(0).to(t.dtype()) * 2.0;
    const Tensor beta = -sign * (alpha.pow(2) + tail_sq).sqrt();
    const Tensor v = x.clone();
    v.narrow(2, 0, 1).sub_(beta);
    const Tensor reflects = tail_sq.gt(0).to(t.dtype());
    const Tensor vtv = (alpha - beta).pow(2) + tail_sq;
    const Tensor coef = reflects * 2.0 / (vtv + (1.0 - reflects));
    if (k + 1 < cols) {
      const Tensor rest = t.narrow(1, k + 1, cols - k - 1).narrow(2, k, rows - k);  // [batch, cols - k - 1, rows - k]
      rest.sub_(rest.matmul(v.transpose(1, 2)) * coef * v);
    }
    vs.push_back(v);
    coefs.push_back(coef);
  }
  t.zero_();
  for (int64_t k = 0; k < cols; ++k) t.narrow(1, k, 1).narrow(2, k, 1).fill_(1.0);
  for (int64_t k = cols - 1; k >= 0; --k) {
    const Tensor q = t.narrow(2, k, rows - k);  // [batch, cols, rows - k]: Q^T's columns k..
    q.sub_(q.matmul(vs[k].transpose(1, 2)) * coefs[k] * vs[k]);
  }
}

// orthogonalize() on each matrices[i] ([batch, rows, cols]), in place.
void orthogonalize_batch(const Tensor& matrices, double epsilon) {
  const Tensor t = matrices.transpose(1, 2).contiguous();
  const bool half = matrices.dtype() == kBFloat16 || matrices.dtype() == kFloat16;
  if (matrices.size(2) <= 2 || half)
    gram_schmidt(t, epsilon);
  else
    householder_qr(t);
  matrices.copy_(t.transpose(1, 2));
}

}  // namespace

void orthogonalize(const Tensor& matrix, double epsilon) {
  ND_CHECK(matrix.dim() == 2 && matrix.size(1) <= matrix.size(0),
           "orthogonalize: expected a matrix [rows, cols] with cols <= rows, found ", matrix.describe());
  orthogonalize_batch(matrix.unsqueeze(0), epsilon);
}

namespace {

// Gradients PowerSGD compresses together: one, or with batch_tensors_with_same_shape all of
// a bucket's of one shape. m is their matrices [b, n, m] (a view of the one gradient, or a
// stacked copy); p, q are their slices of P and Q ([b, n, r], [b, m, r]).
struct Compressed {
  std::vector<std::string> names;
  std::vector<Tensor> matrices;  // each gradient's [n, m] view
  Tensor m, p, q;
};

}  // namespace

std::shared_ptr<FutureWork> powerSGD_hook(PowerSGDState* state, GradBucket& bucket) {
  ND_CHECK(state != nullptr, "powerSGD_hook: expected a PowerSGDState, found none");
  const PowerSGDOptions& o = state->options_;
  const std::shared_ptr<ProcessGroup> group = o.process_group() ? o.process_group() : bucket.process_group();
  ProcessGroup* pg = group.get();
  if (state->iter_ < o.start_powerSGD_iter()) {
    if (bucket.is_last()) ++state->iter_;
    return allreduce_hook(pg, bucket);
  }
  NoGradGuard no_grad;
  state->take_loaded_errors(group);
  const Tensor input = bucket.buffer();
  const std::vector<Tensor>& grads = bucket.gradients();
  std::vector<std::string> names;
  for (const Tensor& p : bucket.parameters()) {
    ND_CHECK(!p.name().empty(), "powerSGD_hook: a parameter of bucket ", bucket.index(), " (", p.describe(),
             ") has no name; PowerSGD keeps its state by parameter name");
    names.push_back(p.name());
  }
  // Error feedback: compress this step's gradient plus what compression lost last step.
  std::vector<Tensor> fed;  // each gradient with it: this step's error is fed - result
  if (o.use_error_feedback()) {
    for (size_t k = 0; k < grads.size(); ++k) {
      auto it = state->error_dict_.find(names[k]);
      if (it != state->error_dict_.end()) {
        ND_CHECK(it->second.numel() == grads[k].numel(), "powerSGD_hook: the error feedback of '", names[k], "' has ",
                 it->second.numel(), " elements, its gradient ", grads[k].numel(),
                 "; the PowerSGDState belongs to another model");
        grads[k].add_(it->second.to(input.device()).view(grads[k].sizes()));
      }
      fed.push_back(grads[k].clone());
    }
  }
  // 1-D gradients and matrices compression would not shrink enough travel as they are.
  std::vector<Tensor> plain;
  std::vector<Compressed> compressed;
  for (size_t k = 0; k < grads.size(); ++k) {
    const Tensor& g = grads[k];
    if (g.dim() <= 1 || g.numel() == 0) {
      plain.push_back(g);
      continue;
    }
    const int64_t n = g.size(0), m = g.numel() / n;
    const int64_t r = std::min({n, m, o.matrix_approximation_rank()});
    if (static_cast<double>((n + m) * r) * o.min_compression_rate() >= static_cast<double>(n * m)) {
      plain.push_back(g);
      continue;
    }
    auto same = std::find_if(compressed.begin(), compressed.end(), [&](const Compressed& c) {
      return c.matrices[0].sizes() == Shape{n, m};
    });
    if (!o.batch_tensors_with_same_shape() || same == compressed.end()) same = compressed.emplace(compressed.end());
    same->names.push_back(names[k]);
    same->matrices.push_back(g.view({n, m}));
  }
  const TensorOptions like = input.options();
  std::vector<Tensor> flat_plain;
  for (const Tensor& g : plain) flat_plain.push_back(g.reshape({g.numel()}));
  const Tensor plain_memory = plain.empty() ? Tensor() : cat(flat_plain);
  int64_t p_size = 0, q_size = 0;
  for (Compressed& c : compressed) {
    const int64_t b = static_cast<int64_t>(c.matrices.size()), n = c.matrices[0].size(0), m = c.matrices[0].size(1);
    const int64_t r = std::min({n, m, o.matrix_approximation_rank()});
    p_size += b * n * r;
    q_size += b * m * r;
  }
  const Tensor p_memory = empty({p_size}, like), q_memory = empty({q_size}, like);
  int64_t p_at = 0, q_at = 0;
  for (Compressed& c : compressed) {
    const int64_t b = static_cast<int64_t>(c.matrices.size()), n = c.matrices[0].size(0), m = c.matrices[0].size(1);
    const int64_t r = std::min({n, m, o.matrix_approximation_rank()});
    c.m = b == 1 ? c.matrices[0].unsqueeze(0) : stack(c.matrices);
    c.p = p_memory.narrow(0, p_at, b * n * r).view({b, n, r});
    c.q = q_memory.narrow(0, q_at, b * m * r).view({b, m, r});
    p_at += b * n * r;
    q_at += b * m * r;
    for (int64_t i = 0; i < b; ++i) {
      const std::string& name = c.names[static_cast<size_t>(i)];
      auto it = state->q_memory_.find(name);
      if (o.warm_start() && it != state->q_memory_.end() && it->second.numel() == m * r) {
        c.q.select(0, i).copy_(it->second.view({m, r}));
      } else {
        // Drawn on the CPU in f64 so that every rank and device type gets the same Q.
        Generator gen{o.random_seed() ^ name_hash(name), static_cast<uint64_t>(state->iter_) << 32};
        c.q.select(0, i).copy_(randn({m, r}, kFloat64, &gen));
      }
    }
    orthogonalize_batch(c.q, o.orthogonalization_epsilon());
    c.p.copy_(c.m.matmul(c.q));
  }
  // Both all-reduces start now, while backward goes on; P is not divided by W (it is
  // orthogonalised next).
  AllreduceOptions sum;
  sum.bucket = static_cast<int64_t>(bucket.index());
  std::vector<std::shared_ptr<Work>> first;
  if (plain_memory.defined()) first.push_back(pg->allreduce(plain_memory, sum));
  if (p_size > 0) first.push_back(pg->allreduce(p_memory, sum));
  const double W = pg->size();
  if (first.empty()) {  // only empty gradients: nothing to reduce
    if (bucket.is_last()) ++state->iter_;
    return FutureWork::completed(input);
  }
  auto finish = [state, pg, sum, W, input, grads, names, fed, plain, plain_memory, compressed, q_memory, first,
                 is_last = bucket.is_last()] {
    NoGradGuard no_grad;
    for (const auto& w : first) w->wait();
    int64_t at = 0;
    for (const Tensor& g : plain) {
      g.copy_(plain_memory.narrow(0, at, g.numel()).view(g.sizes()).div(W));
      at += g.numel();
    }
    if (!compressed.empty()) {
      for (const Compressed& c : compressed) {
        orthogonalize_batch(c.p, state->options_.orthogonalization_epsilon());
        c.q.copy_(c.m.transpose(1, 2).matmul(c.p));
      }
      pg->allreduce(q_memory, sum)->wait();
      q_memory.div_(W);
      for (const Compressed& c : compressed) {
        const Tensor approx = c.p.matmul(c.q.transpose(1, 2));  // [b, n, m]
        for (size_t i = 0; i < c.matrices.size(); ++i) {
          c.matrices[i].copy_(approx.select(0, static_cast<int64_t>(i)));
          if (state->options_.warm_start())
            state->q_memory_[c.names[i]] = c.q.select(0, static_cast<int64_t>(i)).clone();
        }
      }
    }
    for (size_t k = 0; k < fed.size(); ++k) state->error_dict_[names[k]] = fed[k] - grads[k];
    if (is_last) ++state->iter_;
    return input;
  };
  return FutureWork::then(first.back(), finish);
}

std::string comm_hook_name(std::shared_ptr<FutureWork> (*hook)(PowerSGDState*, GradBucket&)) {
  return hook == &powerSGD_hook ? "powerSGD_hook" : "a custom hook";
}

}  // namespace nd::dist
