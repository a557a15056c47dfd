#include "engine/ops/index.h"

#include "engine/ops/common.h"
#include "engine/ops/copy.h"
#include "kernels/cpu/index.h"
#include "kernels/cuda/index.h"

namespace nd {

namespace {

struct Dims3 {
  int64_t outer = 1, D = 1, inner = 1;
};
Dims3 split_at(const Shape& shape, int64_t dim) {
  Dims3 r;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim) r.outer *= shape[d];
    else if (d == dim) r.D = shape[d];
    else r.inner *= shape[d];
  }
  return r;
}

struct IndexSelectBackward : autograd::Node {
  Tensor index;  // contiguous int64, owned by the node (never written in place)
  Shape input_shape;
  int64_t dim = 0;
  std::string name() const override { return "IndexSelectBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gc = g[0].contiguous();
    Tensor dx = zeros(input_shape, gc.options());
    const Dims3 s = split_at(input_shape, dim);
    ops::dispatch_floating("index_select backward", gc, [&]<class T>() {
      const int64_t* ip = index.data_ptr<int64_t>();
      ops::on_device(
          gc,
          [&] {
            kernels::cpu::index_add<T>(s.outer, s.D, s.inner, index.numel(), ip, gc.data_ptr<T>(), dx.data_ptr<T>());
          },
          [&](auto stream) {
            kernels::cuda::index_add<T>(s.outer, s.D, s.inner, index.numel(), ip, gc.data_ptr<T>(), dx.data_ptr<T>(),
                                        stream);
          });
    });
    return {dx};
  }
};

struct CatBackward : autograd::Node {
  std::vector<int64_t> lengths;
  int64_t dim = 0;
  std::string name() const override { return "CatBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    std::vector<Tensor> out;
    int64_t start = 0;
    for (int64_t len : lengths) {
      out.push_back(g[0].narrow(dim, start, len).contiguous());
      start += len;
    }
    return out;
  }
};

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  ND_CHECK(index.dtype() == kInt64 && index.dim() <= 1, "index_select: expected a 1-D i64 index, found ",
           index.describe());
  ND_CHECK(index.device() == x.device() || index.is_cpu(),
           "index_select: expected the index on the input's device or on the cpu, found input ", x.describe(),
           " and index ", index.describe());
  // Checked on the host: an index on the cpu as it is, then copied to x's device without
  // waiting; an index on a GPU read back, which makes the host wait for the device.
  Tensor idx = index.reshape({-1}).contiguous();
  const Tensor idx_host = idx.is_cpu() ? idx : idx.cpu();
  const int64_t* ip = idx_host.data_ptr<int64_t>();
  for (int64_t k = 0; k < idx.numel(); ++k)
    ND_CHECK(ip[k] >= 0 && ip[k] < x.size(d), "index_select: index ", ip[k], " at position ", k,
             " is out of range for dimension ", d, " of size ", x.size(d), " in ", x.describe());
  if (idx.device() != x.device()) idx = idx.to(x.device());
  Tensor xc = x.contiguous();
  Shape out_shape = x.sizes();
  out_shape[d] = idx.numel();
  Tensor out = empty(out_shape, x.options());
  const Dims3 s = split_at(x.sizes(), d);
  dispatch_all(x.dtype(), [&]<class T>() {
    const T* xp = static_cast<const T*>(xc.data_ptr());
    T* outp = static_cast<T*>(out.data_ptr());
    ops::on_device(
        x, [&] { kernels::cpu::index_select<T>(s.outer, s.D, s.inner, xp, idx.numel(), ip, outp); },
        [&](auto stream) {
          kernels::cuda::index_select<T>(s.outer, s.D, s.inner, xp, idx.numel(), idx.data_ptr<int64_t>(), outp,
                                         stream);
        });
  });
  autograd::record<IndexSelectBackward>({x}, {out}, [&](IndexSelectBackward& n) {
    n.index = idx.is_contiguous() && idx.impl_ptr() != index.impl_ptr() ? idx : idx.clone();
    n.input_shape = x.sizes();
    n.dim = d;
  });
  return out;
}

Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return nd::index_select(*this, dim, index); }

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  ND_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  const int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape out_shape = first.sizes();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    ops::check_same_device_dtype("cat", {first, t});
    ND_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " ", t.describe(), " has ", t.dim(),
             " dims; expected ", first.dim(), " like tensor 0 ", first.describe());
    for (int64_t k = 0; k < t.dim(); ++k)
      ND_CHECK(k == d || t.size(k) == first.size(k), "cat: sizes of tensors must match except in dimension ", d,
               ": tensor ", i, " ", t.describe(), " differs from tensor 0 ", first.describe(), " in dimension ", k);
    out_shape[d] += t.size(d);
  }
  Tensor out = empty(out_shape, first.options());
  int64_t start = 0;
  std::vector<int64_t> lengths;
  {
    NoGradGuard no_grad;
    for (const Tensor& t : tensors) {
      copy_data(out.narrow(d, start, t.size(d)), t);
      start += t.size(d);
      lengths.push_back(t.size(d));
    }
  }
  // record() takes an initializer_list; connect by hand for a runtime-length list.
  bool needs_grad = false;
  for (const Tensor& t : tensors) needs_grad |= autograd::any_requires_grad({t});
  if (needs_grad) {
    auto node = std::make_shared<CatBackward>();
    node->sequence_nr = autograd::detail::next_sequence_nr();
    for (const Tensor& t : tensors) autograd::detail::connect(*node, {t});
    node->lengths = lengths;
    node->dim = d;
    autograd::detail::set_history(node, {out});
  } else {
    std::vector<Tensor> ins = tensors;
    for (const Tensor& t : ins) autograd::detail::mark_untracked({t}, {out});
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  ND_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    ND_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: expects each tensor to be equal size, but got ",
             tensors[0].describe(), " at entry 0 and ", tensors[i].describe(), " at entry ", i);
    parts.push_back(tensors[i].unsqueeze(d));
  }
  return cat(parts, d);
}

}  // namespace nd
