#include "engine/ops/softmax.h"

#include "engine/ops/common.h"
#include "kernels/cpu/softmax.h"

namespace nd {

namespace {

// The kernels work on the last dimension of a dense [M, D] array. Another `dim` is
// swapped to the end (one copy in, one copy out): simple and exact, and the common
// case (last dim, contiguous) pays nothing.
struct LastDim {
  int64_t dim;       // wrapped dim of the original tensor
  bool swapped;      // dim was not the last one
  int64_t M, D;
};

LastDim plan(const Tensor& x, int64_t dim, const char* op) {
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);  // a 0-d tensor is one row of one
  LastDim p{wrap_dim(dim, ndim, op), false, 1, 1};
  p.swapped = x.dim() > 0 && p.dim != x.dim() - 1;
  p.D = x.dim() == 0 ? 1 : x.size(p.dim);
  p.M = p.D == 0 ? 0 : x.numel() / p.D;
  return p;
}

// x with `dim` moved last, dense, no history.
Tensor to_rows(const Tensor& x, const LastDim& p) {
  Tensor d = x.detach();
  if (p.swapped) d = d.transpose(p.dim, -1);
  return d.contiguous();
}

// Inverse of to_rows: a fresh dense tensor in the original layout.
Tensor from_rows(const Tensor& rows, const LastDim& p) {
  return p.swapped ? rows.transpose(p.dim, -1).contiguous() : rows;
}

enum class Kind { Softmax, LogSoftmax };

struct SoftmaxBackwardBase : autograd::Node {
  autograd::SavedTensor result;
  LastDim p{};
  Kind kind = Kind::Softmax;
  std::string name() const override {
    return kind == Kind::Softmax ? "SoftmaxBackward" : "LogSoftmaxBackward";
  }
  void release_saved_tensors() override { result.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor y = to_rows(result.unpack(*this), p);
    const Tensor g = to_rows(grads[0], p);
    Tensor dx = empty_like(y);
    ops::dispatch_floating(name().c_str(), y, [&]<class T>() {
      if (kind == Kind::Softmax)
        kernels::cpu::softmax_backward<T>(g.data_ptr<T>(), y.data_ptr<T>(), p.M, p.D, dx.data_ptr<T>());
      else
        kernels::cpu::log_softmax_backward<T>(g.data_ptr<T>(), y.data_ptr<T>(), p.M, p.D, dx.data_ptr<T>());
    });
    return {from_rows(dx, p)};
  }
};

Tensor softmax_impl(const Tensor& x, int64_t dim, Kind kind) {
  const char* op = kind == Kind::Softmax ? "softmax" : "log_softmax";
  ops::check_cpu(op, {x});
  const LastDim p = plan(x, dim, op);
  const Tensor rows = to_rows(x, p);
  Tensor y_rows = empty_like(rows);
  if (p.M > 0) {
    ops::dispatch_floating(op, x, [&]<class T>() {
      if (kind == Kind::Softmax)
        kernels::cpu::softmax_forward<T>(rows.data_ptr<T>(), p.M, p.D, y_rows.data_ptr<T>());
      else
        kernels::cpu::log_softmax_forward<T>(rows.data_ptr<T>(), p.M, p.D, y_rows.data_ptr<T>());
    });
  } else {
    ops::dispatch_floating(op, x, []<class T>() {});  // still reject integer dtypes
  }
  Tensor y = from_rows(y_rows, p);
  autograd::record<SoftmaxBackwardBase>({x}, {y}, [&](SoftmaxBackwardBase& n) {
    n.result = autograd::SavedTensor(y);
    n.p = p;
    n.kind = kind;
  });
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, Kind::Softmax); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, Kind::LogSoftmax); }

Tensor Tensor::softmax(int64_t dim) const { return nd::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return nd::log_softmax(*this, dim); }

}  // namespace nd
