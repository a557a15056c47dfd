#include "engine/ops/copy.h"

#include <type_traits>

#include "engine/factories.h"
#include "engine/ops/common.h"
#include "kernels/cpu/copy.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/runtime.h"

namespace nd {

void fill_data(const Tensor& dst, double value) {
  if (!dst.is_contiguous()) {
    copy_data(dst, full({}, value, dst.options().requires_grad(false)));
    return;
  }
  dispatch_all(dst.dtype(), [&]<class T>() {
    T v;
    if constexpr (std::is_arithmetic_v<T>)
      v = static_cast<T>(value);
    else
      v = T(static_cast<float>(value));
    T* p = dst.data_ptr<T>();
    ops::on_device(
        dst, [&] { kernels::cpu::fill<T>(dst.numel(), v, p); },
        [&](auto stream) { kernels::cuda::fill<T>(dst.numel(), v, p, stream); });
  });
}

namespace {

// dst = src converted to dst's dtype, src broadcast to dst's shape; both on one device,
// any strides. The CUDA twin makes copy_, contiguous() and clone() work on views.
void copy_same_device(const Tensor& dst, const Tensor& src) {
  const Shape src_strides = ops::broadcast_strides(src, dst.sizes());
  dispatch_all(src.dtype(), [&]<class S>() {
    dispatch_all(dst.dtype(), [&]<class D>() {
      const S* sp = static_cast<const S*>(src.data_ptr());
      D* dp = static_cast<D*>(dst.data_ptr());
      ops::on_device(
          dst,
          [&] {
            kernels::cpu::copy_strided<S, D>(dst.dim(), dst.sizes().data(), sp, src_strides.data(), dp,
                                             dst.strides().data());
          },
          [&](auto stream) {
            kernels::cuda::copy_strided<S, D>(dst.dim(), dst.sizes().data(), sp, src_strides.data(), dp,
                                              dst.strides().data(), stream);
          });
    });
  });
}

// The bytes of src and dst can be copied as they are: one dtype, one shape, both dense.
bool same_dense_layout(const Tensor& dst, const Tensor& src) {
  return src.dtype() == dst.dtype() && src.sizes() == dst.sizes() && src.is_contiguous() && dst.is_contiguous();
}

// Copies between devices move src's dense bytes unchanged; broadcasting, strides and
// dtype conversion happen on the destination's side (on the GPU when it is a GPU).
// A non-blocking copy needs src itself dense and pinned: a contiguous() copy of it would
// be pageable memory again.
void copy_across_devices(const Tensor& dst, const Tensor& src, bool non_blocking) {
  NoGradGuard no_grad;  // layout copies only; the caller records the op
  if (dst.is_cpu() && kernels::cuda::capture_active())
    kernels::cuda::refuse_during_capture(src.device().index, "copy " + src.describe() + " to the CPU",
                                         "the host would wait for values the capture only records; copy them after a "
                                         "replay");
  if (src.is_cpu() && kernels::cuda::capture_active())
    kernels::cuda::refuse_during_capture(dst.device().index, "copy " + src.describe() + " to " + dst.device().str(),
                                         "a replay would not copy it again; fill a static CUDA tensor with copy_ "
                                         "before replay()");
  const Tensor dense = src.contiguous();
  const size_t nbytes = dense.numel() * element_size(dense.dtype());
  const bool direct = same_dense_layout(dst, dense);
  const Tensor landing = direct ? dst : empty(dense.sizes(), dense.options().device(dst.device()));
  if (src.is_cpu() && non_blocking && dense.is_pinned())
    kernels::cuda::copy_pinned_to_device_async(dst.device().index, landing.data_ptr(), dense.storage()->data(),
                                               dense.data_ptr(), nbytes);
  else if (src.is_cpu())
    kernels::cuda::copy_host_to_device(dst.device().index, landing.data_ptr(), dense.data_ptr(), nbytes);
  else if (dst.is_cpu())
    kernels::cuda::copy_device_to_host(src.device().index, landing.data_ptr(), dense.data_ptr(), nbytes);
  else
    kernels::cuda::copy_device_to_device(dst.device().index, landing.data_ptr(), src.device().index,
                                         dense.data_ptr(), nbytes);
  if (!direct) copy_same_device(dst, landing);
}

}  // namespace

void copy_data(const Tensor& dst, const Tensor& src, bool non_blocking) {
  ND_CHECK(ops::broadcast_shapes("copy_", dst.sizes(), src.sizes()) == dst.sizes(), "copy_: source ",
           src.describe(), " cannot be broadcast to destination ", dst.describe());
  if (dst.device() != src.device()) return copy_across_devices(dst, src, non_blocking);
  if (dst.is_cuda() && same_dense_layout(dst, src)) {
    kernels::cuda::copy_device_to_device(dst.device().index, dst.data_ptr(), src.device().index, src.data_ptr(),
                                         dst.numel() * element_size(dst.dtype()));
    return;
  }
  copy_same_device(dst, src);
}

namespace {

// Gradient of a copy: back to the source's shape, dtype and device.
struct CopyBackwards : autograd::Node {
  Shape src_shape;
  ScalarType src_dtype = kFloat32;
  Device src_device;
  std::string op = "CopyBackwards";
  std::string name() const override { return op; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    Tensor g = autograd::sum_to(grads[0], src_shape);
    if (g.dtype() != src_dtype) g = g.to(src_dtype);
    if (g.device() != src_device) g = g.to(src_device);
    return {g};
  }
};

Tensor copy_to_new(const Tensor& src, TensorOptions options, const char* node_name, bool non_blocking = false) {
  Tensor out = empty(src.sizes(), options);
  copy_data(out, src, non_blocking);
  if (is_floating_point(options.dtype_))
    autograd::record<CopyBackwards>({src}, {out}, [&](CopyBackwards& n) {
      n.src_shape = src.sizes();
      n.src_dtype = src.dtype();
      n.src_device = src.device();
      n.op = node_name;
    });
  return out;
}

// copy_ with history: the old value of self is overwritten (no gradient), src gets g.
struct InplaceCopyBackward : autograd::Node {
  Shape src_shape;
  ScalarType src_dtype = kFloat32;
  Device src_device;
  std::string name() const override { return "CopyBackwards"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    Tensor g = autograd::sum_to(grads[0], src_shape);
    if (g.dtype() != src_dtype) g = g.to(src_dtype);
    if (g.device() != src_device) g = g.to(src_device);
    return {Tensor(), g};
  }
};

}  // namespace

Tensor Tensor::to(Device device, bool non_blocking) const {
  if (device == this->device()) return *this;
  cuda::check_device(device);
  return copy_to_new(*this, options().device(device), "ToCopyBackward", non_blocking);
}

// Differentiable like clone(): the gradient flows back to the pageable original.
Tensor Tensor::pin_memory() const {
  ND_CHECK(is_cpu(), "pin_memory: expected a cpu tensor, found ", describe(), "; only host memory can be pinned");
  if (is_pinned()) return *this;
  cuda::check_pinned_memory("pin_memory");
  return copy_to_new(*this, options().pinned_memory(true), "CloneBackward");
}

Tensor Tensor::to(ScalarType dtype) const {
  if (dtype == this->dtype()) return *this;
  return copy_to_new(*this, options().dtype(dtype), "ToCopyBackward");
}

Tensor Tensor::clone() const { return copy_to_new(*this, options(), "CloneBackward"); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

const Tensor& Tensor::copy_(const Tensor& src) const {
  const bool history = autograd::any_requires_grad({*this, src});
  ops::check_inplace("copy_", *this, history);
  copy_data(*this, src);
  ops::bump_version(*this, "copy_");
  if (history) {
    Tensor old_self = *this;
    autograd::record<InplaceCopyBackward>({old_self, src}, {*this}, [&](InplaceCopyBackward& n) {
      n.src_shape = src.sizes();
      n.src_dtype = src.dtype();
      n.src_device = src.device();
    });
  }
  return *this;
}

}  // namespace nd
