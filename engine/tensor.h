#pragma once
// Tensor: a shared handle to TensorImpl {Storage, shape, strides, offset, dtype,
// autograd fields, name}. Copying a Tensor copies the handle (like LibTorch).
// An undefined Tensor (default-constructed, or a .grad() that never received a
// gradient) carries the reason it is undefined; using it throws that reason.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/storage.h"

namespace nd {

class Tensor;
namespace autograd {
class Node;
}

using Shape = std::vector<int64_t>;
using PostAccumulateGradHook = std::function<void(const Tensor&)>;

struct TensorOptions {
  ScalarType dtype_ = kFloat32;
  Device device_;
  bool requires_grad_ = false;
  bool pinned_memory_ = false;  // cpu only: page-locked, for asynchronous copies to a GPU

  TensorOptions() = default;
  TensorOptions(ScalarType t) : dtype_(t) {}
  TensorOptions(Device d) : device_(d) {}
  TensorOptions(DeviceType d) : device_(d) {}
  TensorOptions dtype(ScalarType t) const { auto o = *this; o.dtype_ = t; return o; }
  TensorOptions device(Device d) const { auto o = *this; o.device_ = d; return o; }
  TensorOptions requires_grad(bool r) const { auto o = *this; o.requires_grad_ = r; return o; }
  TensorOptions pinned_memory(bool p) const { auto o = *this; o.pinned_memory_ = p; return o; }
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  ScalarType dtype = kFloat32;

  // autograd
  bool requires_grad = false;
  bool retains_grad = false;
  bool is_view = false;          // shares storage with the tensor it was derived from
  bool produced_untracked = false;  // made by detach() or an op under no-grad from grad-requiring inputs
  bool marked_after_untracked = false;  // requires_grad_(true) was called on such a tensor
  bool last_read_untracked = false;  // a leaf that requires grad, last read by an op under no-grad
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<autograd::Node> grad_accumulator;
  std::vector<PostAccumulateGradHook> post_accumulate_grad_hooks;

  std::string name;  // parameter name ("D.main.0.weight") or user label; used in errors
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // An undefined tensor whose every use throws `why`.
  static Tensor undefined_because(std::string why);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl& impl() const;  // throws nd::Error (with the reason) if undefined
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- metadata ----
  const Shape& sizes() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t numel() const;
  int64_t storage_offset() const { return impl().offset; }
  ScalarType dtype() const { return impl().dtype; }
  ScalarType scalar_type() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  TensorOptions options() const { return TensorOptions(dtype()).device(device()); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_pinned() const { return impl().storage->is_pinned(); }
  bool is_contiguous() const;
  bool is_floating_point() const { return nd::is_floating_point(dtype()); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  void* data_ptr() const;
  template <class T>
  T* data_ptr() const;  // checks T matches dtype()
  template <class T>
  T item() const;       // one-element tensors only
  double item() const { return item<double>(); }
  // "[cpu f32 [64, 1, 4, 4]] 'name'" as used in error messages.
  std::string describe() const;

  // ---- naming and versions ----
  const std::string& name() const { return impl().name; }
  const Tensor& set_name(std::string name) const;
  int64_t _version() const { return impl().storage->version(); }

  // ---- autograd ----
  bool requires_grad() const { return impl().requires_grad; }
  const Tensor& requires_grad_(bool requires_grad = true) const;
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  // The accumulated gradient; an undefined tensor that explains why when none arrived.
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;  // an undefined tensor clears it
  void retain_grad() const;
  bool retains_grad() const { return impl().retains_grad; }
  // Runs after AccumulateGrad has added into .grad (DDP marks readiness here).
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;
  // Shares storage and version counter; no grad_fn, requires_grad false.
  Tensor detach() const;
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

  // ---- views (engine/ops/view.cpp): share storage, differentiable ----
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  // (engine/ops/index.cpp)
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor index(const Tensor& index) const { return index_select(0, index); }

  // ---- copies and conversion (engine/ops/copy.cpp) ----
  // non_blocking: a copy from pinned memory to a GPU is queued on the device's compute
  // stream and returns at once (kernels on that device see its result; the host may drop
  // or overwrite the source, which waits for the copy). Every other copy is complete when it
  // returns, as in PyTorch for pageable memory; device -> host is always complete.
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(ScalarType dtype) const;
  Tensor to(DeviceType device) const { return to(Device(device)); }
  Tensor cpu() const { return to(Device(kCPU)); }
  // A copy in pinned host memory (this tensor when it is pinned already); CPU tensors only,
  // needs a CUDA GPU.
  Tensor pin_memory() const;
  Tensor clone() const;
  const Tensor& copy_(const Tensor& src) const;

  // ---- math (engine/ops/elementwise.cpp, reduce.cpp) ----
  Tensor add(const Tensor& other, double alpha = 1) const;
  Tensor add(double other) const;
  Tensor sub(const Tensor& other, double alpha = 1) const;
  Tensor sub(double other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(double other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(double other) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor pow(double exponent) const;
  Tensor neg() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor abs() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor clamp(double min, double max) const;
  Tensor maximum(const Tensor& other) const;
  Tensor minimum(const Tensor& other) const;
  Tensor eq(const Tensor& other) const;  // bool result, no gradient
  Tensor gt(double other) const;
  Tensor lt(double other) const;
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor var(const Shape& dims, int64_t correction = 1, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  // (engine/ops/matmul.cpp, engine/ops/softmax.cpp)
  Tensor matmul(const Tensor& other) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // ---- in-place (bump the version counter; engine/ops/elementwise.cpp) ----
  const Tensor& add_(const Tensor& other, double alpha = 1) const;
  // Also on a contiguous int64 or int32 tensor, with an integral value (one kernel:
  // BatchNorm counts num_batches_tracked with it).
  const Tensor& add_(double other) const;
  const Tensor& sub_(const Tensor& other, double alpha = 1) const;
  const Tensor& mul_(const Tensor& other) const;
  const Tensor& mul_(double other) const;
  const Tensor& div_(const Tensor& other) const;
  const Tensor& div_(double other) const;
  const Tensor& addcmul_(const Tensor& a, const Tensor& b, double value = 1) const;
  const Tensor& addcdiv_(const Tensor& a, const Tensor& b, double value = 1) const;
  const Tensor& clamp_(double min, double max) const;
  const Tensor& zero_() const;
  const Tensor& fill_(double value) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
  std::shared_ptr<const std::string> why_undefined_;
};

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string shape_str(const Shape& shape);  // "[2, 3]"

// Named tensors in name order: state dicts and checkpoint contents.
using TensorDict = std::map<std::string, Tensor>;

// Contiguous row-major strides for `shape`.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace nd
