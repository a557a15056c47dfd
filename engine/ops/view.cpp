#include "engine/ops/view.h"

#include <algorithm>
#include <numeric>

#include "engine/ops/common.h"
#include "engine/ops/copy.h"

namespace nd {

namespace {

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  const TensorImpl& b = base.impl();
  auto v = std::make_shared<TensorImpl>();
  v->storage = b.storage;
  v->shape = std::move(shape);
  v->strides = std::move(strides);
  v->offset = offset;
  v->dtype = b.dtype;
  v->is_view = true;
  v->name = b.name;  // errors about a view name the tensor it views (e.g. a transposed weight)
  return Tensor(v);
}

// Backward of every view that only rearranges elements: reshape the gradient back.
struct ViewBackward : autograd::Node {
  Shape input_shape;
  std::string name() const override { return "ViewBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].reshape(input_shape)}; }
};

struct PermuteBackward : autograd::Node {
  Shape inverse;
  std::string name() const override { return "PermuteBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].permute(inverse)}; }
};

struct ExpandBackward : autograd::Node {
  Shape input_shape;
  std::string name() const override { return "ExpandBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {autograd::sum_to(g[0], input_shape)}; }
};

// narrow/slice/select: scatter the gradient into zeros of the input's shape.
struct SliceBackward : autograd::Node {
  Shape input_shape;
  int64_t dim = 0, start = 0, end = 0, step = 1;
  bool squeezed = false;  // select() removed `dim`
  std::string name() const override { return squeezed ? "SelectBackward" : "SliceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gi = zeros(input_shape, g[0].options());
    copy_data(gi.slice(dim, start, end, step), squeezed ? g[0].unsqueeze(dim) : g[0]);
    return {gi};
  }
  // Another slice of the same tensor already gave a gradient (q, k and v of one packed
  // projection): one add into its region, not a zero-filled tensor, a copy and a full add.
  bool apply_into(std::vector<Tensor>& g, const Tensor& into) override {
    into.slice(dim, start, end, step).add_(squeezed ? g[0].unsqueeze(dim) : g[0]);
    return true;
  }
};

Tensor view_with_history(const Tensor& self, Shape shape, Shape strides, int64_t offset) {
  Tensor v = make_view(self, std::move(shape), std::move(strides), offset);
  autograd::record<ViewBackward>({self}, {v}, [&](ViewBackward& n) { n.input_shape = self.sizes(); });
  return v;
}

Shape infer_shape(const Shape& shape, int64_t numel, const Tensor& self, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      ND_CHECK(infer < 0, op, ": only one dimension can be inferred (-1), got shape ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      ND_CHECK(out[i] >= 0, op, ": invalid shape dimension ", out[i], " in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    ND_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for input ",
             self.describe(), " of ", numel, " elements");
    out[infer] = numel / known;
  }
  ND_CHECK(shape_numel(out) == numel, op, ": shape ", shape_str(shape), " is invalid for input ", self.describe(),
           " of ", numel, " elements");
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), *this, "view");
  ND_CHECK(is_contiguous(), "view: view size is not compatible with input tensor's size and stride (", describe(),
           " is not contiguous). Use reshape(...) instead.");
  return view_with_history(*this, s, contiguous_strides(s), storage_offset());
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), *this, "reshape");
  return is_contiguous() ? view(s) : contiguous().view(s);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  ND_CHECK(s <= e, "flatten: start_dim (", s, ") cannot come after end_dim (", e, ")");
  Shape shape(sizes().begin(), sizes().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= size(d);
  shape.push_back(n);
  shape.insert(shape.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(shape);
}

Tensor Tensor::permute(const Shape& dims) const {
  ND_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: expected ", dim(), " dims for ", describe(),
           ", found ", shape_str(dims));
  Shape shape(dims.size()), strides(dims.size()), inverse(dims.size());
  std::vector<bool> used(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    ND_CHECK(!used[d], "permute: dimension ", d, " repeats in ", shape_str(dims));
    used[d] = true;
    shape[i] = size(d);
    strides[i] = stride(d);
    inverse[d] = static_cast<int64_t>(i);
  }
  Tensor v = make_view(*this, shape, strides, storage_offset());
  autograd::record<PermuteBackward>({*this}, {v}, [&](PermuteBackward& n) { n.inverse = inverse; });
  return v;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (dim() < 2 && d0 == d1) return *this;
  Shape dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, dim(), "transpose")], dims[wrap_dim(d1, dim(), "transpose")]);
  return permute(dims);
}

Tensor Tensor::t() const {
  ND_CHECK(dim() <= 2, "t(): expected a tensor with <= 2 dimensions, found ", describe());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  ND_CHECK(step > 0, "slice: step must be positive, found ", step);
  const int64_t n = size(d);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = sizes(), strides = this->strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  Tensor v = make_view(*this, shape, strides, storage_offset() + start * stride(d));
  autograd::record<SliceBackward>({*this}, {v}, [&](SliceBackward& node) {
    node.input_shape = sizes();
    node.dim = d;
    node.start = start;
    node.end = end;
    node.step = step;
  });
  return v;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  if (start < 0) start += size(d);
  ND_CHECK(start >= 0 && length >= 0 && start + length <= size(d), "narrow: start (", start, ") + length (",
           length, ") exceeds dimension ", d, " of size ", size(d), " in ", describe());
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  const int64_t n = size(d);
  ND_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dimension ", d, " of size ", n,
           " in ", describe());
  if (index < 0) index += n;
  Shape shape = sizes(), strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Tensor v = make_view(*this, shape, strides, storage_offset() + index * stride(d));
  autograd::record<SliceBackward>({*this}, {v}, [&](SliceBackward& node) {
    node.input_shape = sizes();
    node.dim = d;
    node.start = index;
    node.end = index + 1;
    node.squeezed = true;
  });
  return v;
}

Tensor Tensor::expand(const Shape& shape) const {
  ND_CHECK(static_cast<int64_t>(shape.size()) >= dim(), "expand: the number of sizes provided (", shape.size(),
           ") must be greater or equal to the number of dimensions of ", describe());
  const size_t lead = shape.size() - static_cast<size_t>(dim());
  Shape out(shape.size()), strides(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      ND_CHECK(shape[i] >= 0, "expand: invalid size ", shape[i], " for a new leading dimension");
      out[i] = shape[i];
      continue;
    }
    const int64_t have = size(static_cast<int64_t>(i - lead));
    const int64_t want = shape[i] == -1 ? have : shape[i];
    ND_CHECK(have == want || have == 1, "expand: the expanded size (", want, ") must match the existing size (",
             have, ") at non-singleton dimension ", i, ". Target sizes: ", shape_str(shape), ", tensor ", describe());
    out[i] = want;
    strides[i] = have == want ? stride(static_cast<int64_t>(i - lead)) : 0;
  }
  Tensor v = make_view(*this, out, strides, storage_offset());
  autograd::record<ExpandBackward>({*this}, {v}, [&](ExpandBackward& n) { n.input_shape = sizes(); });
  return v;
}

Tensor Tensor::squeeze() const {
  Shape shape, strides;
  for (int64_t d = 0; d < dim(); ++d)
    if (size(d) != 1) {
      shape.push_back(size(d));
      strides.push_back(stride(d));
    }
  return view_with_history(*this, shape, strides, storage_offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (dim() == 0 || size(d) != 1) return *this;
  Shape shape = sizes(), strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return view_with_history(*this, shape, strides, storage_offset());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape shape = sizes(), strides = this->strides();
  const int64_t st = d < dim() ? stride(d) * size(d) : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return view_with_history(*this, shape, strides, storage_offset());
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  d = wrap_dim(d, dim(), "split");
  ND_CHECK(split_size > 0 || (split_size == 0 && size(d) == 0), "split: expected a positive split_size, found ",
           split_size);
  std::vector<Tensor> parts;
  for (int64_t start = 0; start < size(d); start += split_size)
    parts.push_back(narrow(d, start, std::min(split_size, size(d) - start)));
  return parts;
}

}  // namespace nd
