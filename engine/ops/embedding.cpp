#include "engine/ops/embedding.h"

#include "engine/ops/common.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.h"

namespace nd {

namespace {

struct EmbeddingBackward : autograd::Node {
  autograd::SavedTensor indices;
  int64_t num_embeddings = 0, D = 0, padding_idx = -1;
  std::string name() const override { return "EmbeddingBackward"; }
  void release_saved_tensors() override { indices.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor idx = indices.unpack(*this);
    const Tensor g = grads[0].contiguous();
    Tensor dw = empty({num_embeddings, D}, g.options());
    ops::dispatch_floating("embedding backward", g, [&]<class T>() {
      const T* gp = g.data_ptr<T>();
      const int64_t* ip = idx.data_ptr<int64_t>();
      T* dwp = dw.data_ptr<T>();
      const int64_t n = idx.numel();
      ops::on_device(
          g, [&] { kernels::cpu::embedding_backward<T>(gp, ip, n, num_embeddings, D, padding_idx, dwp); },
          [&](auto stream) {
            kernels::cuda::embedding_backward<T>(gp, ip, n, num_embeddings, D, padding_idx, dwp, stream);
          });
    });
    return {dw, Tensor()};
  }
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  const char* op = "embedding";
  ND_CHECK(weight.dim() == 2, op, ": expected weight of 2 dims ([num_embeddings, embedding_dim]), found ",
           weight.describe());
  ND_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32, op,
           ": expected indices of dtype i64 or i32, found ", indices.describe());
  ND_CHECK(indices.device() == weight.device(), op, ": expected indices on ", weight.device().str(), ", found ",
           indices.describe());
  const int64_t V = weight.size(0), D = weight.size(1);
  ND_CHECK(padding_idx >= -1 && padding_idx < V, op, ": expected padding_idx in [-1, ", V,
           ") (-1 = none), found ", padding_idx);

  const Tensor idx = indices.dtype() == kInt64 ? indices.detach().contiguous() : indices.detach().to(kInt64);
  const Tensor w = weight.detach().contiguous();
  Shape out_shape = indices.sizes();
  out_shape.push_back(D);
  Tensor out = empty(out_shape, weight.options());
  ops::dispatch_floating(op, weight, [&]<class T>() {
    const T* wp = w.data_ptr<T>();
    const int64_t* ip = idx.data_ptr<int64_t>();
    T* outp = out.data_ptr<T>();
    int64_t bad = -1;
    ops::on_device(
        w, [&] { bad = kernels::cpu::embedding_forward<T>(wp, V, D, ip, idx.numel(), outp); },
        [&](auto stream) { bad = kernels::cuda::embedding_forward<T>(wp, V, D, ip, idx.numel(), outp, stream); });
    // idx is contiguous; on CUDA its values are read back only to report the bad one.
    ND_CHECK(bad < 0, op, ": index ", bad >= 0 ? idx.cpu().data_ptr<int64_t>()[bad] : 0, " out of range for weight ",
             weight.describe(), " with ", V, " rows (num_embeddings); expected indices in [0, ", V,
             "), found it at flat position ", bad, " of indices ", indices.describe());
  });
  autograd::record<EmbeddingBackward>({weight, indices}, {out}, [&](EmbeddingBackward& n) {
    n.indices = autograd::SavedTensor(idx);
    n.num_embeddings = V;
    n.D = D;
    n.padding_idx = padding_idx;
  });
  return out;
}

}  // namespace nd
