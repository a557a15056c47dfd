#include "engine/tensor.h"

#include <iomanip>
#include <ostream>
#include <sstream>

#include "engine/autograd.h"
#include "engine/error.h"
#include "kernels/cuda/graph.h"

namespace nd {

Tensor Tensor::undefined_because(std::string why) {
  Tensor t;
  t.why_undefined_ = std::make_shared<const std::string>(std::move(why));
  return t;
}

TensorImpl& Tensor::impl() const {
  if (!impl_) {
    throw Error(why_undefined_ ? "use of an undefined tensor: " + *why_undefined_
                               : std::string("use of an undefined tensor (default-constructed nd::Tensor)"));
  }
  return *impl_;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = ndim == 0 ? 1 : ndim;  // a 0-d tensor accepts dim 0 and -1
  ND_CHECK(dim >= -n && dim < n, op, ": dimension out of range (expected to be in range of [", -n, ", ",
           n - 1, "], but got ", dim, ")");
  return dim < 0 ? dim + n : dim;
}

int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return shape_numel(impl().shape); }

bool Tensor::is_contiguous() const {
  const auto& im = impl();
  int64_t expected = 1;
  for (size_t i = im.shape.size(); i-- > 0;) {
    if (im.shape[i] == 1) continue;
    if (im.strides[i] != expected) return false;
    expected *= im.shape[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const auto& im = impl();
  return static_cast<char*>(im.storage->data()) + im.offset * static_cast<int64_t>(element_size(im.dtype));
}

template <class T>
T* Tensor::data_ptr() const {
  ND_CHECK(dtype_of<T>::value == dtype(), "data_ptr<", dtype_name(dtype_of<T>::value), ">() called on ",
           describe(), ": expected element type ", dtype_name(dtype()));
  return static_cast<T*>(data_ptr());
}

template <class T>
T Tensor::item() const {
  ND_CHECK(numel() == 1, "item(): expected a tensor with one element, found ", describe());
  if (is_cuda() && kernels::cuda::capture_active())
    kernels::cuda::refuse_during_capture(device().index, "read " + describe() + " with item()",
                                         "the host would wait for a value the capture only records; read it after a "
                                         "replay");
  Tensor c = is_cpu() ? *this : cpu();
  return dispatch_all(c.dtype(), [&]<class S>() { return static_cast<T>(*static_cast<const S*>(c.data_ptr())); });
}

#define ND_INSTANTIATE(T) \
  template T* Tensor::data_ptr<T>() const; \
  template T Tensor::item<T>() const;
ND_INSTANTIATE(float)
ND_INSTANTIATE(double)
ND_INSTANTIATE(BFloat16)
ND_INSTANTIATE(Half)
ND_INSTANTIATE(int64_t)
ND_INSTANTIATE(int32_t)
ND_INSTANTIATE(uint8_t)
ND_INSTANTIATE(bool)
#undef ND_INSTANTIATE

std::string Tensor::describe() const {
  if (!defined()) return "[undefined tensor]";
  std::string s = "[" + device().str() + " " + dtype_name(dtype()) + " " + shape_str(sizes()) + "]";
  if (!name().empty()) s += " '" + name() + "'";
  return s;
}

const Tensor& Tensor::set_name(std::string name) const {
  impl().name = std::move(name);
  return *this;
}

const Tensor& Tensor::requires_grad_(bool requires_grad) const {
  auto& im = impl();
  if (!requires_grad) {
    ND_CHECK(is_leaf(), "requires_grad_(false) on ", describe(),
             ": you can only change requires_grad flags of leaf tensors. Use detach() to get a tensor "
             "that does not require grad.");
  } else {
    ND_CHECK(is_floating_point(), "requires_grad_(true) on ", describe(),
             ": only floating point tensors can require gradients");
    if (im.produced_untracked && !im.requires_grad) im.marked_after_untracked = true;
  }
  im.requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& im = impl();
  if (im.grad) return Tensor(im.grad);
  const std::string who = describe();
  if (!im.requires_grad) {
    if (im.produced_untracked)
      return undefined_because(".grad of " + who + " is undefined: it was produced under NoGradGuard or by "
                               "detach(), so it does not require grad and is not part of any graph. Compute "
                               "it with grad mode on if you need its gradient.");
    return undefined_because(".grad of " + who + " is undefined: the tensor does not require grad. Call "
                             "requires_grad_(true) on it before the forward pass that uses it.");
  }
  if (!is_leaf() && !im.retains_grad)
    return undefined_because(".grad of " + who + " is undefined: it is not a leaf (it was computed by " +
                             "an op), and only leaves get .grad. Call retain_grad() on it before backward.");
  if (im.last_read_untracked)
    return undefined_because(".grad of " + who + " is undefined: no gradient has reached it, and the last op "
                             "that read it ran with grad mode off (under NoGradGuard, e.g. a module's forward in "
                             "evaluation code), which records no graph for backward to follow. Run the forward "
                             "whose loss should train it with grad mode on.");
  return undefined_because(".grad of " + who + " is undefined: no gradient has reached it yet (no backward "
                           "has run through it since it was created or its grad was cleared).");
}

void Tensor::set_grad(const Tensor& grad) const {
  if (!grad.defined()) {
    impl().grad.reset();
    return;
  }
  ND_CHECK(grad.sizes() == sizes() && grad.dtype() == dtype() && grad.device() == device(), "set_grad on ",
           describe(), ": expected a gradient of the same shape, dtype and device, found ", grad.describe());
  impl().grad = grad.impl_ptr();
}

void Tensor::retain_grad() const {
  ND_CHECK(requires_grad(), "retain_grad() on ", describe(), ": can't retain_grad on a tensor that has "
           "requires_grad=false");
  auto& im = impl();
  if (im.retains_grad || !im.grad_fn) return;  // leaves get .grad anyway
  im.retains_grad = true;
  im.grad_fn->retained_grads.emplace_back(im.output_nr, impl_ptr());
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  ND_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook on ", describe(),
           ": post accumulate grad hooks can only be registered on leaf tensors that require grad");
  impl().post_accumulate_grad_hooks.push_back(std::move(hook));
}

Tensor Tensor::detach() const {
  const auto& im = impl();
  auto out = std::make_shared<TensorImpl>();
  out->storage = im.storage;
  out->shape = im.shape;
  out->strides = im.strides;
  out->offset = im.offset;
  out->dtype = im.dtype;
  out->is_view = true;
  out->produced_untracked = im.requires_grad || im.produced_untracked;
  out->name = im.name;
  return Tensor(out);
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{},
                     retain_graph);
}

// ---- printing ----
namespace {
void print_rec(std::ostream& os, const Tensor& c, int64_t d, int64_t base, int indent) {
  const auto& shape = c.sizes();
  const auto& strides = c.strides();
  if (d == c.dim()) {
    dispatch_all(c.dtype(), [&]<class T>() {
      const T v = static_cast<const T*>(c.data_ptr())[base];
      if constexpr (std::is_same_v<T, bool>)
        os << (v ? "True" : "False");
      else if constexpr (std::is_integral_v<T>)
        os << static_cast<int64_t>(v);
      else
        os << std::setprecision(4) << static_cast<double>(static_cast<float>(v));
    });
    return;
  }
  os << "[";
  const int64_t n = shape[d];
  for (int64_t i = 0; i < n; ++i) {
    if (n > 8 && i == 3) {
      os << "..., ";
      i = n - 3;
    }
    print_rec(os, c, d + 1, base + i * strides[d], indent + 1);
    if (i + 1 < n) os << (d + 1 == c.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  Tensor c = t.is_cpu() ? t : t.cpu();
  os << "tensor(";
  print_rec(os, c, 0, 0, 7);
  if (c.dtype() != kFloat32) os << ", dtype=" << dtype_name(c.dtype());
  if (t.is_cuda()) os << ", device='" << t.device().str() << "'";
  if (t.grad_fn()) os << ", grad_fn=<" << t.grad_fn()->name() << ">";
  else if (t.requires_grad()) os << ", requires_grad=True";
  return os << ")";
}

}  // namespace nd
