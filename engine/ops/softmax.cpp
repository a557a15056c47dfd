#include "engine/ops/softmax.h"

#include "engine/ops/common.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/softmax.h"

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

// y = softmax or log_softmax of the dense rows x, on x's device.
template <class T>
void forward_rows(Kind kind, const Tensor& x, const LastDim& p, const Tensor& y) {
  const T* xp = x.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const bool soft = kind == Kind::Softmax;
  ops::on_device(
      x,
      [&] {
        if (soft) kernels::cpu::softmax_forward<T>(xp, p.M, p.D, yp);
        else kernels::cpu::log_softmax_forward<T>(xp, p.M, p.D, yp);
      },
      [&](auto stream) {
        if (soft) kernels::cuda::softmax_forward<T>(xp, p.M, p.D, yp, stream);
        else kernels::cuda::log_softmax_forward<T>(xp, p.M, p.D, yp, stream);
      });
}

// dx from the incoming gradient g and the forward's output y (dense rows), on y's device.
template <class T>
void backward_rows(Kind kind, const Tensor& g, const Tensor& y, const LastDim& p, const Tensor& dx) {
  const T *gp = g.data_ptr<T>(), *yp = y.data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  const bool soft = kind == Kind::Softmax;
  ops::on_device(
      y,
      [&] {
        if (soft) kernels::cpu::softmax_backward<T>(gp, yp, p.M, p.D, dxp);
        else kernels::cpu::log_softmax_backward<T>(gp, yp, p.M, p.D, dxp);
      },
      [&](auto stream) {
        if (soft) kernels::cuda::softmax_backward<T>(gp, yp, p.M, p.D, dxp, stream);
        else kernels::cuda::log_softmax_backward<T>(gp, yp, p.M, p.D, dxp, stream);
      });
}

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
    ops::dispatch_floating(name().c_str(), y, [&]<class T>() { backward_rows<T>(kind, g, y, p, dx); });
    return {from_rows(dx, p)};
  }
};

Tensor softmax_impl(const Tensor& x, int64_t dim, Kind kind) {
  const char* op = kind == Kind::Softmax ? "softmax" : "log_softmax";
  const LastDim p = plan(x, dim, op);
  const Tensor rows = to_rows(x, p);
  Tensor y_rows = empty_like(rows);
  if (p.M > 0) {
    ops::dispatch_floating(op, x, [&]<class T>() { forward_rows<T>(kind, rows, p, y_rows); });
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

Tensor softmax(const Tensor& x, int64_t dim, autograd::CallSite) { return softmax_impl(x, dim, Kind::Softmax); }
Tensor log_softmax(const Tensor& x, int64_t dim, autograd::CallSite) { return softmax_impl(x, dim, Kind::LogSoftmax); }

Tensor Tensor::softmax(int64_t dim) const { return nd::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return nd::log_softmax(*this, dim); }

}  // namespace nd
