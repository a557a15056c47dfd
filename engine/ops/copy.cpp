#include "engine/ops/copy.h"

#include "engine/ops/common.h"
#include "kernels/cpu/copy.h"
#include "kernels/cuda/runtime.h"

namespace nd {

namespace {

void copy_cpu(const Tensor& dst, const Tensor& src) {
  const Shape src_strides = ops::broadcast_strides(src, dst.sizes());
  dispatch_all(src.dtype(), [&]<class S>() {
    dispatch_all(dst.dtype(), [&]<class D>() {
      kernels::cpu::copy_strided<S, D>(dst.dim(), dst.sizes().data(), static_cast<const S*>(src.data_ptr()),
                                       src_strides.data(), static_cast<D*>(dst.data_ptr()), dst.strides().data());
    });
  });
}

// src on the CPU, expanded and converted to dst's layout and dtype.
Tensor staged_on_cpu(const Tensor& src, const Tensor& like) {
  Tensor host = src;
  if (src.is_cuda()) {
    Tensor dense = src.is_contiguous() ? src : src.contiguous();
    host = empty(dense.sizes(), TensorOptions(dense.dtype()));
    kernels::cuda::copy_device_to_host(src.device().index, host.data_ptr(), dense.data_ptr(),
                                       dense.numel() * element_size(dense.dtype()));
  }
  Tensor out = empty(like.sizes(), TensorOptions(like.dtype()));
  copy_cpu(out, host);
  return out;
}

}  // namespace

void copy_data(const Tensor& dst, const Tensor& src) {
  ops::broadcast_shapes("copy_", dst.sizes(), src.sizes());
  ND_CHECK(ops::broadcast_shapes("copy_", dst.sizes(), src.sizes()) == dst.sizes(), "copy_: source ",
           src.describe(), " cannot be broadcast to destination ", dst.describe());
  if (dst.is_cpu() && src.is_cpu()) return copy_cpu(dst, src);
  const size_t nbytes = dst.numel() * element_size(dst.dtype());
  if (dst.is_cuda()) {
    ND_CHECK(dst.is_contiguous(), "copy_: writing into a non-contiguous CUDA tensor ", dst.describe(),
             " is not supported yet; copy into a contiguous tensor");
    if (src.is_cuda() && src.dtype() == dst.dtype() && src.is_contiguous() && src.sizes() == dst.sizes()) {
      kernels::cuda::copy_device_to_device(dst.device().index, dst.data_ptr(), src.device().index, src.data_ptr(),
                                           nbytes);
      return;
    }
    Tensor host = staged_on_cpu(src, dst);
    kernels::cuda::copy_host_to_device(dst.device().index, dst.data_ptr(), host.data_ptr(), nbytes);
    return;
  }
  copy_cpu(dst, staged_on_cpu(src, dst));  // CUDA -> CPU
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

Tensor copy_to_new(const Tensor& src, TensorOptions options, const char* node_name) {
  Tensor out = empty(src.sizes(), options);
  copy_data(out, src);
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

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  cuda::check_device(device);
  return copy_to_new(*this, options().device(device), "ToCopyBackward");
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
