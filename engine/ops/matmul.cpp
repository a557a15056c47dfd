// mm, bmm and matmul: argument checks, the gemm call, and the backward formulas.
//   C = A B   =>   dA = dC B^T,   dB = A^T dC   (per batch for bmm).
// Transposed or row-padded operands go to the kernel as they are (gemm's trans flags
// and leading dimensions), so x.t() and the backward's transposes cost no copy; only
// operands with neither unit-stride rows nor columns are copied. matmul is composed
// of views + mm/bmm, so its gradient (including broadcast batch dimensions, summed
// back by ExpandBackward) comes from those ops' nodes. Under autocast (engine/autocast.h)
// f32 products take operands rounded to autocast's dtype (bf16 or f16).
#include "engine/ops/matmul.h"

#include <algorithm>

#include "engine/autocast.h"
#include "engine/ops/common.h"
#include "engine/ops/copy.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.h"

namespace nd {
namespace {

// How gemm reads the last two dims [r, c] of a 2-D or 3-D tensor.
struct Operand {
  Tensor t;      // the tensor itself, or a contiguous copy
  bool trans;    // stored column-major (unit stride along rows)
  int64_t ld;    // leading dimension
  int64_t batch_stride;
};

Operand as_operand(const Tensor& x) {
  const int64_t r = x.size(-2), c = x.size(-1), sr = x.stride(-2), sc = x.stride(-1);
  const int64_t bs = x.dim() == 3 ? x.stride(0) : 0;
  if ((c == 1 || sc == 1) && (r == 1 || sr >= std::max<int64_t>(c, 1)))
    return {x, false, r == 1 ? std::max<int64_t>(c, 1) : sr, bs};
  if ((r == 1 || sr == 1) && (c == 1 || sc >= std::max<int64_t>(r, 1)))
    return {x, true, c == 1 ? std::max<int64_t>(r, 1) : sc, bs};
  NoGradGuard no_grad;  // a private copy for the kernel; the graph records x itself
  Tensor y = x.contiguous();
  return {y, false, std::max<int64_t>(c, 1), x.dim() == 3 ? r * c : 0};
}

// out[b] = a[b] * b[b] (+ out[b] when accumulate) for b < batch (a, b 2-D when batch == 1
// and unbatched), in the tensors' own precision.
void run_gemm_exact(const char* op, const Tensor& a, const Tensor& b, int64_t batch, const Tensor& out,
                    bool accumulate = false) {
  const Operand A = as_operand(a), B = as_operand(b);
  const int64_t n = a.size(-2), m = a.size(-1), p = b.size(-1);
  ops::dispatch_floating(op, a, [&]<class T>() {
    const T *ap = A.t.data_ptr<T>(), *bp = B.t.data_ptr<T>();
    T* cp = out.data_ptr<T>();
    const int64_t ldc = std::max<int64_t>(p, 1);
    ops::on_device(
        out,
        [&] {
          kernels::cpu::bmm<T>(A.trans, B.trans, batch, n, p, m, T(1), ap, A.ld, A.batch_stride, bp, B.ld,
                               B.batch_stride, T(accumulate), cp, ldc, n * p);
        },
        [&](auto stream) {
          kernels::cuda::bmm<T>(A.trans, B.trans, batch, n, p, m, T(1), ap, A.ld, A.batch_stride, bp, B.ld,
                                B.batch_stride, T(accumulate), cp, ldc, n * p, stream);
        });
  });
}

// The same product under autocast: operands rounded to its dtype (bf16 or f16), f32
// accumulation and output. CUDA multiplies bf16 / f16 copies on tensor cores; the CPU
// multiplies the rounded values in f32, which gives the same products (bf16 x bf16 and
// f16 x f16 are exact in f32).
void run_gemm(const char* op, const Tensor& a, const Tensor& b, int64_t batch, const Tensor& out,
              bool accumulate = false) {
  if (!autocast_applies(a)) return run_gemm_exact(op, a, b, batch, out, accumulate);
  NoGradGuard no_grad;  // private copies for the kernel; the graph records a and b
  const ScalarType dtype = autocast_dtype(a.device().type);
  const Tensor a16 = a.to(dtype), b16 = b.to(dtype);
  ops::on_device(
      out, [&] { run_gemm_exact(op, a16.to(kFloat32), b16.to(kFloat32), batch, out, accumulate); },
      [&](auto stream) {
        const Operand A = as_operand(a16), B = as_operand(b16);
        const int64_t n = a.size(-2), m = a.size(-1), p = b.size(-1), ldc = std::max<int64_t>(p, 1);
        const float beta = accumulate ? 1.0f : 0.0f;
        if (dtype == kFloat16)
          kernels::cuda::bmm_f16(A.trans, B.trans, batch, n, p, m, 1.0f, A.t.data_ptr<Half>(), A.ld, A.batch_stride,
                                 B.t.data_ptr<Half>(), B.ld, B.batch_stride, beta, out.data_ptr<float>(), ldc, n * p,
                                 stream);
        else
          kernels::cuda::bmm_bf16(A.trans, B.trans, batch, n, p, m, 1.0f, A.t.data_ptr<BFloat16>(), A.ld,
                                  A.batch_stride, B.t.data_ptr<BFloat16>(), B.ld, B.batch_stride, beta,
                                  out.data_ptr<float>(), ldc, n * p, stream);
      });
}

std::string dims_str(const Tensor& t) {  // "2x3" as in PyTorch's message
  std::string s;
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "x" : "") + std::to_string(t.size(d));
  return s;
}

// A matrix stored column-major: a transpose of a contiguous one (linear's weight.t()).
bool column_major(const Tensor& t) { return t.size(0) > 1 && t.stride(0) == 1 && t.stride(1) == t.size(0); }

// mm: dmat1 = g mat2^T, dmat2 = mat1^T g. Each input is saved only when the other
// input's gradient needs it, so updating a tensor no gradient reads is not an error.
// Each gradient takes its input's layout: for a column-major input it is computed as the
// transpose of a row-major product ((g^T mat1)^T for mat2), so that linear's weight
// gradient comes back through weight.t() contiguous, and AccumulateGrad keeps it without
// a copy (PyTorch's mm_mat2_backward does the same).
// Both backwards multiply in the precision their forward did (autocast or not).
struct MmBackward : autograd::Node {
  autograd::SavedTensor mat1, mat2;
  bool mat1_column_major = false, mat2_column_major = false;
  DeviceType device = kCPU;
  bool autocast = false;
  ScalarType autocast_dtype = kBFloat16;
  std::string name() const override { return "MmBackward"; }
  void release_saved_tensors() override { mat1.reset(); mat2.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    AutocastGuard precision(device, autocast, autocast_dtype);
    Tensor g1, g2;
    if (next_edges[0].fn) {
      const Tensor m2 = mat2.unpack(*this);
      g1 = mat1_column_major ? mm(m2, g[0].t()).t() : mm(g[0], m2.t());
    }
    if (next_edges[1].fn) {
      const Tensor m1 = mat1.unpack(*this);
      g2 = mat2_column_major ? mm(g[0].t(), m1).t() : mm(m1.t(), g[0]);
    }
    return {g1, g2};
  }
};

// Records what MmBackward (and AddmmBackward) keep for the product mat1 mat2.
void save_operands(MmBackward& n, const Tensor& mat1, const Tensor& mat2) {
  n.device = mat1.device().type;
  n.autocast = autocast_applies(mat1);
  n.autocast_dtype = nd::autocast_dtype(n.device);
  n.mat1_column_major = column_major(mat1);
  n.mat2_column_major = column_major(mat2);
  if (n.next_edges[1].fn) n.mat1 = autograd::SavedTensor(mat1);
  if (n.next_edges[0].fn) n.mat2 = autograd::SavedTensor(mat2);
}

// addmm, its inputs recorded as (mat1, mat2, input): the matrices' gradients as in mm,
// the input's g summed to its shape (a bias: over the rows).
struct AddmmBackward : MmBackward {
  Shape input_sizes;
  std::string name() const override { return "AddmmBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor gi;
    if (next_edges[2].fn) gi = autograd::sum_to(g[0], input_sizes);
    std::vector<Tensor> grads = MmBackward::apply(std::move(g));
    grads.push_back(gi);
    return grads;
  }
};

// The checks mm and addmm share: two matrices of one device and dtype that multiply.
void check_mm_operands(const char* op, const Tensor& mat1, const Tensor& mat2) {
  ops::check_dim(op, mat1, 2, "mat1 [n, m]");
  ops::check_dim(op, mat2, 2, "mat2 [m, p]");
  ops::check_same_device_dtype(op, {mat1, mat2});
  ND_CHECK(mat1.size(1) == mat2.size(0), op, ": mat1 and mat2 shapes cannot be multiplied (", dims_str(mat1), " and ",
           dims_str(mat2), "): expected mat2 with ", mat1.size(1), " rows, found ", mat2.describe());
}

struct BmmBackward : autograd::Node {
  autograd::SavedTensor batch1, batch2;
  DeviceType device = kCPU;
  bool autocast = false;
  ScalarType autocast_dtype = kBFloat16;
  std::string name() const override { return "BmmBackward"; }
  void release_saved_tensors() override { batch1.reset(); batch2.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    AutocastGuard precision(device, autocast, autocast_dtype);
    Tensor g1, g2;
    if (next_edges[0].fn) g1 = bmm(g[0], batch2.unpack(*this).transpose(1, 2));
    if (next_edges[1].fn) g2 = bmm(batch1.unpack(*this).transpose(1, 2), g[0]);
    return {g1, g2};
  }
};

}  // namespace

Tensor mm(const Tensor& mat1, const Tensor& mat2, autograd::CallSite) {
  check_mm_operands("mm", mat1, mat2);
  Tensor out = empty({mat1.size(0), mat2.size(1)}, mat1.options());
  run_gemm("mm", mat1, mat2, 1, out);
  autograd::record<MmBackward>({mat1, mat2}, {out}, [&](MmBackward& n) { save_operands(n, mat1, mat2); });
  return out;
}

Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2, autograd::CallSite) {
  check_mm_operands("addmm", mat1, mat2);
  ops::check_same_device_dtype("addmm", {mat1, input});
  const Shape out_shape{mat1.size(0), mat2.size(1)};
  ND_CHECK(input.dim() <= 2 && ops::broadcast_shapes("addmm", input.sizes(), out_shape) == out_shape,
           "addmm: expected input broadcastable to the product's shape ", shape_str(out_shape), ", found ",
           input.describe());
  Tensor out = empty(out_shape, mat1.options());
  copy_data(out, input);  // the product accumulates onto it: no separate add pass
  run_gemm("addmm", mat1, mat2, 1, out, /*accumulate=*/true);
  autograd::record<AddmmBackward>({mat1, mat2, input}, {out}, [&](AddmmBackward& n) {
    save_operands(n, mat1, mat2);
    n.input_sizes = input.sizes();
  });
  return out;
}

Tensor bmm(const Tensor& batch1, const Tensor& batch2, autograd::CallSite) {
  ops::check_dim("bmm", batch1, 3, "batch1 [B, n, m]");
  ops::check_dim("bmm", batch2, 3, "batch2 [B, m, p]");
  ops::check_same_device_dtype("bmm", {batch1, batch2});
  ND_CHECK(batch1.size(0) == batch2.size(0), "bmm: expected batch2 with the batch size of batch1 (", batch1.size(0),
           "), found ", batch2.describe(), " for batch1 ", batch1.describe());
  ND_CHECK(batch1.size(2) == batch2.size(1), "bmm: batch1 and batch2 shapes cannot be multiplied (",
           dims_str(batch1), " and ", dims_str(batch2), "): expected batch2 with ", batch1.size(2),
           " rows per matrix, found ", batch2.describe());
  Tensor out = empty({batch1.size(0), batch1.size(1), batch2.size(2)}, batch1.options());
  run_gemm("bmm", batch1, batch2, batch1.size(0), out);
  autograd::record<BmmBackward>({batch1, batch2}, {out}, [&](BmmBackward& n) {
    n.device = batch1.device().type;
    n.autocast = autocast_applies(batch1);
    n.autocast_dtype = nd::autocast_dtype(n.device);
    if (n.next_edges[1].fn) n.batch1 = autograd::SavedTensor(batch1);
    if (n.next_edges[0].fn) n.batch2 = autograd::SavedTensor(batch2);
  });
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, autograd::CallSite) {
  ND_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, found ", a.describe(),
           " and ", b.describe());
  ops::check_same_device_dtype("matmul", {a, b});
  const int64_t da = a.dim(), db = b.dim();
  const int64_t m = a.size(-1), mb = db == 1 ? b.size(0) : b.size(-2);
  ND_CHECK(m == mb, "matmul: shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
           " cannot be multiplied: expected ", db == 1 ? "b" : "b's second-to-last dimension", " to be ", m,
           " (a's last dimension), found ", mb, " in ", b.describe());
  if (da == 1 && db == 1) return mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  if (da == 2 && db == 2) return mm(a, b);
  if (da == 1 && db == 2) return mm(a.unsqueeze(0), b).squeeze(0);
  if (da == 2 && db == 1) return mm(a, b.unsqueeze(1)).squeeze(1);
  if (db <= 2) {
    // [..., n, m] x [m, p] (or [m]): fold the batch into the rows, one GEMM.
    Shape out(a.sizes().begin(), a.sizes().end() - 1);
    const Tensor rows = a.reshape({shape_numel(out), m});
    if (db == 2) out.push_back(b.size(1));
    return mm(rows, db == 2 ? b : b.unsqueeze(1)).reshape(out);
  }
  // Batched: 1-D operands become matrices, batch dims broadcast, bmm over the flat batch.
  const Tensor a2 = da == 1 ? a.unsqueeze(0) : a, b2 = db == 1 ? b.unsqueeze(1) : b;
  const int64_t n = a2.size(-2), p = b2.size(-1);
  const Shape batch_a(a2.sizes().begin(), a2.sizes().end() - 2), batch_b(b2.sizes().begin(), b2.sizes().end() - 2);
  const Shape batch = ops::broadcast_shapes("matmul", batch_a, batch_b);
  const int64_t B = shape_numel(batch);
  auto flat = [&](const Tensor& t, int64_t r, int64_t c) {
    Shape full = batch;
    full.push_back(r);
    full.push_back(c);
    Tensor e = t.expand(full);  // a broadcast batch dim stays stride 0 when it is the only one
    return batch.size() == 1 ? e : e.reshape({B, r, c});
  };
  Tensor r = bmm(flat(a2, n, m), flat(b2, m, p));
  Shape out = batch;
  if (da > 1) out.push_back(n);
  if (db > 1) out.push_back(p);
  return r.reshape(out);
}

Tensor Tensor::matmul(const Tensor& other) const { return nd::matmul(*this, other); }

}  // namespace nd
