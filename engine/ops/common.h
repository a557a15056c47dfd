#pragma once
// Shared argument checks and dtype dispatch for engine/ops. Every op checks its
// arguments here before touching a kernel, so errors read the same everywhere.
#include <initializer_list>
#include <string>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/tensor.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/stream.h"

namespace nd::ops {

// Calls fn.template operator()<T>() with T = float or double; any other dtype is an
// nd::Error naming the op and the tensor.
template <class Fn>
decltype(auto) dispatch_floating(const char* op, const Tensor& t, Fn&& fn) {
  switch (t.dtype()) {
    case kFloat32: return fn.template operator()<float>();
    case kFloat64: return fn.template operator()<double>();
    default:
      throw Error(std::string(op) + ": expected a f32 or f64 tensor, found " + t.describe());
  }
}

// Runs cpu() when `t` is on the CPU, else makes t's device current and runs
// cuda(stream) with its compute stream. `cuda` is a generic lambda
// (`[&](auto stream) { kernels::cuda::op<T>(..., stream); }`): a build without CUDA never
// instantiates it (no CUDA tensor can exist there), so it links without kernels/cuda.
// A CUDA error names the call and the kernel (kernels/cuda check(), require()); this adds
// the tensor the kernel ran on: "... (running on [cuda:0 f32 [64, 1, 4, 4]] 'D.main.0.weight')".
// While a CUDA graph is being captured, a CPU op is refused: the replay would not run it.
template <class Cpu, class Cuda>
void on_device(const Tensor& t, Cpu&& cpu, Cuda&& cuda) {
  if (!t.is_cuda()) {
    if (kernels::cuda::capture_active())
      kernels::cuda::refuse_during_capture(-1, "run a CPU op on " + t.describe(),
                                           "a replay runs only the CUDA work; move the tensor to the GPU or out of "
                                           "the captured step");
    return cpu();
  }
#ifdef NANODDP_WITH_CUDA
  try {
    cuda(kernels::cuda::use_device(t.device().index));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (running on " + t.describe() + ")");
  }
#else
  (void)cuda;
  throw Error("a CUDA tensor in a build without CUDA: " + t.describe());
#endif
}

// Every defined tensor is defined, on the same device and of the same dtype as the first one.
void check_same_device_dtype(const char* op, std::initializer_list<Tensor> tensors);
// ndim == expected, else "op: expected a 4-D input ([N, C, H, W]), found [cpu f32 [3, 4]]".
void check_dim(const char* op, const Tensor& t, int64_t expected, const char* layout);

// Broadcast shape of a and b (NumPy rules), or an nd::Error naming both shapes.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// Strides that read `t` as if expanded to `shape` (0 on broadcast dimensions).
Shape broadcast_strides(const Tensor& t, const Shape& shape);

// In-place ops: refuse to silently corrupt autograd state, bump the version.
// `self` is about to be written by `op` (pinned memory first waits for the asynchronous
// copies that read it).
void check_inplace(const char* op, const Tensor& self, bool records_history);
void bump_version(const Tensor& self, const char* op);

// Names the in-place writer for version errors ("Adam.step" instead of "add_")
// for as long as it lives. Optimizers hold one around their updates.
class InplaceOpLabel {
 public:
  explicit InplaceOpLabel(std::string label);
  ~InplaceOpLabel();
  InplaceOpLabel(const InplaceOpLabel&) = delete;
  InplaceOpLabel& operator=(const InplaceOpLabel&) = delete;
  static const std::string* current();

 private:
  std::string label_;
  const std::string* previous_;
};

}  // namespace nd::ops
