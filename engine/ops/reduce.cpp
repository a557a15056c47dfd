#include "engine/ops/reduce.h"

#include <algorithm>
#include <optional>

#include "engine/ops/common.h"
#include "engine/ops/elementwise.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"

namespace nd {

namespace {

// Which dims of x a reduction over `dims` reduces (empty dims = all).
std::vector<bool> reduced_dims(const char* op, const Tensor& x, const Shape& dims) {
  std::vector<bool> reduced(x.dim(), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, x.dim(), op);
    ND_CHECK(!reduced[w] || dims.empty(), op, ": dim ", w, " appears multiple times in ", shape_str(dims));
    reduced[w] = true;
  }
  return reduced;
}

// x viewed as contiguous [M, R] with the reduced dims last, plus the result shapes.
struct Rows {
  Tensor data;  // contiguous, reduced dims last
  int64_t M = 1, R = 1;
  Shape keep_shape;  // reduced dims kept as 1
  Shape out_shape;   // as requested (keepdim or not)
  Shape order;       // the permutation that moved the reduced dims last
};

// The shapes and the permutation only; to_rows adds the data.
Rows plan_rows(const Tensor& x, const std::vector<bool>& reduced, bool keepdim) {
  Rows r;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!reduced[d]) {
      r.order.push_back(d);
      r.M *= x.size(d);
      r.out_shape.push_back(x.size(d));
    } else if (keepdim) {
      r.out_shape.push_back(1);
    }
    r.keep_shape.push_back(reduced[d] ? 1 : x.size(d));
  }
  for (int64_t d = 0; d < x.dim(); ++d)
    if (reduced[d]) {
      r.order.push_back(d);
      r.R *= x.size(d);
    }
  return r;
}

Rows to_rows(const char* op, const Tensor& x, const Shape& dims, bool keepdim) {
  Rows r = plan_rows(x, reduced_dims(op, x, dims), keepdim);
  NoGradGuard no_grad;  // layout only; the caller records the op's own node
  r.data = x.permute(r.order).contiguous();
  return r;
}

// x read in place as [R, C] rows `ld` elements apart, when the reduced dims lead: the
// kept dims (size-1 dims ignored) are contiguous after one another, and the reduced ones
// walk their rows with one stride. Then a sum needs no transposed copy (sum_columns).
// nullopt when the layout does not allow it, or when nothing or everything is reduced
// (then the permute is the identity, and a contiguous x goes to sum_rows uncopied).
struct Columns {
  int64_t R = 1, C = 1, ld = 0;
};
std::optional<Columns> leading_columns(const Tensor& x, const std::vector<bool>& reduced) {
  Columns cols;
  bool in_reduced = false;
  int64_t expected = 1;  // the stride the next (outer) dim must have
  for (int64_t d = x.dim(); d-- > 0;) {
    if (x.size(d) == 1) continue;
    if (!reduced[d]) {
      if (in_reduced || x.stride(d) != expected) return std::nullopt;
      cols.C *= x.size(d);
      expected *= x.size(d);
      continue;
    }
    if (!in_reduced) {
      in_reduced = true;
      cols.ld = expected = x.stride(d);
    }
    if (x.stride(d) != expected) return std::nullopt;
    cols.R *= x.size(d);
    expected *= x.size(d);
  }
  if (!in_reduced || cols.C == 1) return std::nullopt;
  return cols;
}

// sum/mean: the gradient is broadcast back (mean divides by the count).
struct SumBackward : autograd::Node {
  Shape input_shape, keep_shape;
  double scale = 1;
  std::string op = "SumBackward";
  std::string name() const override { return op; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gk = g[0].reshape(keep_shape);
    if (scale != 1) gk = gk * scale;
    return {gk.expand(input_shape).contiguous()};
  }
};

// var: d/dx_i = 2 (x_i - mean) / (R - correction).
struct VarBackward : autograd::Node {
  autograd::SavedTensor x;
  Shape dims, keep_shape;
  double denom = 1;
  std::string name() const override { return "VarBackward"; }
  void release_saved_tensors() override { x.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor xv = x.unpack(*this);
    Tensor centered = xv - (dims.empty() ? mean(xv) : mean(xv, dims, /*keepdim=*/true));
    return {centered * g[0].reshape(keep_shape) * (2.0 / denom)};
  }
};

// max: the gradient goes to the (first) maximal element of each row.
struct MaxBackward : autograd::Node {
  Tensor indices;  // [M] int64, not a saved tensor: never written in place
  Shape input_shape;
  Shape order;  // permutation used to move the reduced dim last
  int64_t M = 1, R = 1;
  std::string name() const override { return "MaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gc = g[0].contiguous();
    Shape permuted_shape;
    for (int64_t d : order) permuted_shape.push_back(input_shape[d]);
    Tensor dx = empty(permuted_shape, gc.options());
    ops::dispatch_floating("max backward", gc, [&]<class T>() {
      const int64_t* ip = indices.data_ptr<int64_t>();
      ops::on_device(
          gc, [&] { kernels::cpu::scatter_rows<T>(M, R, ip, gc.data_ptr<T>(), dx.data_ptr<T>()); },
          [&](auto stream) { kernels::cuda::scatter_rows<T>(M, R, ip, gc.data_ptr<T>(), dx.data_ptr<T>(), stream); });
    });
    Shape inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
    return {dx.permute(inverse).contiguous()};
  }
};

// max(), amax (and min(), amin through -x): the gradient is split evenly among the elements
// equal to the result, as PyTorch's evenly_distribute_backward and amax's backward do:
// dx = g * [x == result] / #[x == result] over the reduced dims.
struct TiesBackward : autograd::Node {
  autograd::SavedTensor x, result;
  Shape dims;        // empty: every dim
  Shape keep_shape;  // the result with the reduced dims kept as 1
  std::string node_name;
  std::string name() const override { return node_name; }
  void release_saved_tensors() override { x.reset(); result.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor xv = x.unpack(*this);
    Tensor ties = eq(xv, result.unpack(*this).reshape(keep_shape)).to(xv.dtype());
    Tensor count = dims.empty() ? sum(ties) : sum(ties, dims, /*keepdim=*/true);
    return {g[0].reshape(keep_shape) * ties / count};
  }
};

Tensor sum_impl(const char* op, const Tensor& x, const Shape& dims, bool keepdim, bool is_mean) {
  const std::vector<bool> reduced = reduced_dims(op, x, dims);
  Rows r = plan_rows(x, reduced, keepdim);
  ND_CHECK(!is_mean || r.R > 0, op, ": mean over zero elements of ", x.describe());
  Tensor out = empty(r.out_shape, x.options());
  // A sum over leading dims (bias gradients) reads x in place, column by column.
  const std::optional<Columns> cols = leading_columns(x, reduced);
  if (!cols) {
    NoGradGuard no_grad;
    r.data = x.permute(r.order).contiguous();
  }
  ops::dispatch_floating(op, x, [&]<class T>() {
    ops::on_device(
        x,
        [&] {
          if (cols)
            kernels::cpu::sum_columns<T>(cols->R, cols->C, cols->ld, x.data_ptr<T>(), out.data_ptr<T>());
          else
            kernels::cpu::sum_rows<T>(r.M, r.R, r.data.data_ptr<T>(), out.data_ptr<T>());
        },
        [&](auto stream) {
          if (cols)
            kernels::cuda::sum_columns<T>(cols->R, cols->C, cols->ld, x.data_ptr<T>(), out.data_ptr<T>(), stream);
          else
            kernels::cuda::sum_rows<T>(r.M, r.R, r.data.data_ptr<T>(), out.data_ptr<T>(), stream);
        });
  });
  if (is_mean) {
    NoGradGuard no_grad;
    out = out / static_cast<double>(r.R);
  }
  autograd::record<SumBackward>({x}, {out}, [&](SumBackward& n) {
    n.input_shape = x.sizes();
    n.keep_shape = r.keep_shape;
    n.scale = is_mean ? 1.0 / static_cast<double>(r.R) : 1.0;
    n.op = is_mean ? "MeanBackward" : "SumBackward";
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, autograd::CallSite) { return sum_impl("sum", x, {}, false, false); }
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim, autograd::CallSite) {
  ND_CHECK(!dims.empty() || x.dim() == 0, "sum: expected at least one dim; use sum(x) to reduce everything");
  return sum_impl("sum", x, dims, keepdim, false);
}
Tensor mean(const Tensor& x, autograd::CallSite) { return sum_impl("mean", x, {}, false, true); }
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim, autograd::CallSite) {
  ND_CHECK(!dims.empty() || x.dim() == 0, "mean: expected at least one dim; use mean(x) to reduce everything");
  return sum_impl("mean", x, dims, keepdim, true);
}

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim, autograd::CallSite) {
  Rows r = to_rows("var", x, dims, keepdim);
  ND_CHECK(r.R - correction > 0, "var: ", r.R, " element(s) per reduction with correction ", correction,
           " leaves no degrees of freedom (input ", x.describe(), ")");
  Tensor out = empty(r.out_shape, x.options());
  ops::dispatch_floating("var", x, [&]<class T>() {
    const T* xp = r.data.data_ptr<T>();
    ops::on_device(
        x, [&] { kernels::cpu::var_rows<T>(r.M, r.R, correction, xp, out.data_ptr<T>()); },
        [&](auto stream) { kernels::cuda::var_rows<T>(r.M, r.R, correction, xp, out.data_ptr<T>(), stream); });
  });
  autograd::record<VarBackward>({x}, {out}, [&](VarBackward& n) {
    n.x = autograd::SavedTensor(x);
    n.dims = dims;
    n.keep_shape = r.keep_shape;
    n.denom = static_cast<double>(r.R - correction);
  });
  return out;
}

namespace {
// split_ties: the gradient is shared by all maximal elements (TiesBackward), else it goes to
// the first one (MaxBackward, max(x, dim)'s rule).
std::tuple<Tensor, Tensor> max_impl(const char* op, const Tensor& x, const Shape& dims, bool keepdim,
                                    bool split_ties = false) {
  Rows r = to_rows(op, x, dims, keepdim);
  ND_CHECK(r.R > 0, op, ": cannot take the maximum of zero elements of ", x.describe());
  Tensor values = empty(r.out_shape, x.options());
  Tensor indices = empty(r.out_shape, TensorOptions(kInt64).device(x.device()));
  dispatch_all(x.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int64_t> ||
                  std::is_same_v<T, int32_t>)
      ops::on_device(
          x,
          [&] {
            kernels::cpu::max_rows<T>(r.M, r.R, r.data.data_ptr<T>(), values.data_ptr<T>(),
                                      indices.data_ptr<int64_t>());
          },
          [&](auto stream) {
            kernels::cuda::max_rows<T>(r.M, r.R, r.data.data_ptr<T>(), values.data_ptr<T>(),
                                       indices.data_ptr<int64_t>(), stream);
          });
    else
      throw Error(std::string(op) + ": unsupported dtype in " + x.describe());
  });
  if (x.is_floating_point() && split_ties)
    autograd::record<TiesBackward>({x}, {values}, [&](TiesBackward& n) {
      n.x = autograd::SavedTensor(x);
      n.result = autograd::SavedTensor(values);
      n.dims = dims;
      n.keep_shape = r.keep_shape;
      n.node_name = std::string(op) == "max" ? "MaxBackward" : "AmaxBackward";
    });
  else if (x.is_floating_point())
    autograd::record<MaxBackward>({x}, {values}, [&](MaxBackward& n) {
      n.indices = indices;
      n.input_shape = x.sizes();
      n.M = r.M;
      n.R = r.R;
      n.order = r.order;
    });
  return {values, indices};
}
}  // namespace

Tensor max(const Tensor& x, autograd::CallSite) {
  return std::get<0>(max_impl("max", x, {}, false, /*split_ties=*/true));
}
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim, autograd::CallSite) {
  return max_impl("max", x, {wrap_dim(dim, x.dim(), "max")}, keepdim);
}
Tensor amax(const Tensor& x, const Shape& dims, bool keepdim, autograd::CallSite) {
  return std::get<0>(max_impl("amax", x, dims, keepdim, /*split_ties=*/true));
}
// The minima are the maxima of -x (exact: negation only flips the sign bit, NaN stays the
// extreme): values, first indices and the split of ties all carry over.
Tensor min(const Tensor& x, autograd::CallSite) { return neg(max(neg(x))); }
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim, autograd::CallSite) {
  auto [values, indices] = max(neg(x), dim, keepdim);
  return {neg(values), indices};
}
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim, autograd::CallSite) {
  return neg(amax(neg(x), dims, keepdim));
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return std::get<1>(max_impl("argmax", x, {wrap_dim(dim, x.dim(), "argmax")}, keepdim));
}

Tensor Tensor::sum() const { return nd::sum(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return nd::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return nd::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return nd::mean(*this, dims, keepdim); }
Tensor Tensor::var(const Shape& dims, int64_t correction, bool keepdim) const {
  return nd::var(*this, dims, correction, keepdim);
}
Tensor Tensor::max() const { return nd::max(*this); }
Tensor Tensor::min() const { return nd::min(*this); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return nd::argmax(*this, dim, keepdim); }

}  // namespace nd
