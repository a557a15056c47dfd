#include "engine/ops/common.h"

namespace nd::ops {

void check_same_device_dtype(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!first) {
      first = &t;
      continue;
    }
    ND_CHECK(t.device() == first->device(), op, ": expected all tensors on the same device, found ",
             first->describe(), " and ", t.describe());
    ND_CHECK(t.dtype() == first->dtype(), op, ": expected all tensors of the same dtype, found ",
             first->describe(), " and ", t.describe());
  }
}

void check_dim(const char* op, const Tensor& t, int64_t expected, const char* layout) {
  ND_CHECK(t.dim() == expected, op, ": expected a ", expected, "-D tensor (", layout, "), found ", t.describe());
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    ND_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape strides(shape.size(), 0);
  const size_t lead = shape.size() - static_cast<size_t>(t.dim());
  for (size_t i = lead; i < shape.size(); ++i)
    strides[i] = t.size(static_cast<int64_t>(i - lead)) == 1 ? 0 : t.stride(static_cast<int64_t>(i - lead));
  return strides;
}

void check_inplace(const char* op, const Tensor& self, bool records_history) {
  self.storage()->wait_for_copies();  // pinned memory that a non-blocking copy still reads
  if (!GradMode::is_enabled()) return;
  ND_CHECK(!(self.is_leaf() && self.requires_grad()), op, " on ", self.describe(),
           ": a leaf tensor that requires grad is being used in an in-place operation. Wrap the update in "
           "nd::NoGradGuard (as optimizers do) or use the out-of-place op.");
  ND_CHECK(!(records_history && self.impl().is_view), op, " on ", self.describe(),
           ": in-place ops that record gradient history are not supported on views; use the out-of-place op");
}

void bump_version(const Tensor& self, const char* op) {
  const std::string* label = InplaceOpLabel::current();
  self.storage()->bump_version(label ? *label : std::string(op));
}

namespace {
thread_local const std::string* t_label = nullptr;
}
InplaceOpLabel::InplaceOpLabel(std::string label) : label_(std::move(label)), previous_(t_label) { t_label = &label_; }
InplaceOpLabel::~InplaceOpLabel() { t_label = previous_; }
const std::string* InplaceOpLabel::current() { return t_label; }

}  // namespace nd::ops
