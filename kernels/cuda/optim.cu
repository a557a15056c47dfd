// Fused optimizer steps: one thread per parameter element reads p, g and the state
// once and writes them once, with the CPU's per-element update (kernels/common/optim_math.h);
// the coefficients and bias corrections are computed once on the host.
#include "kernels/cuda/optim.h"

#include <cstring>

#include "kernels/common/optim_math.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;

template <class T>
__global__ void sgd_kernel(int64_t n, optim_math::Sgd<T> c, T* p, const T* g, T* buf) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    optim_math::sgd_update(c, i, p, g, buf);
}

template <class T>
__global__ void adam_kernel(int64_t n, optim_math::Adam<T> c, T* p, const T* g, T* m, T* v, T* vmax) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    optim_math::adam_update(c, i, p, g, m, v, vmax);
}

// Multi-tensor Adam: block b updates elements [start, start + kChunk) of tensor `entry`.
constexpr int64_t kChunk = optim_math::kAdamChunk;  // elements per block: 16 per thread

template <class T>
struct AdamEntry {
  optim_math::Adam<T> c;
  int64_t n;
  T* p;
  const T* g;
  T *m, *v, *vmax;
};
struct Chunk {
  int64_t entry, start;
};

template <class T>
__global__ void adam_multi_kernel(const AdamEntry<T>* entries, const Chunk* chunks) {
  const Chunk chunk = chunks[blockIdx.x];
  const AdamEntry<T>& e = entries[chunk.entry];
  const int64_t end = chunk.start + kChunk < e.n ? chunk.start + kChunk : e.n;
  for (int64_t i = chunk.start + threadIdx.x; i < end; i += blockDim.x)
    optim_math::adam_update(e.c, i, e.p, e.g, e.m, e.v, e.vmax);
}

// Every thread that sees a non-finite value stores the same 1: the flag ends the same
// whichever thread wins, so no atomic is needed.
template <class T>
__global__ void unscale_kernel(int64_t n, T* g, T inv_scale, int32_t* found) {
  bool nonfinite = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const T x = g[i];
    nonfinite = nonfinite || !(x - x == T(0));
    g[i] = x * inv_scale;
  }
  if (nonfinite) *found = 1;
}

}  // namespace

template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf, cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, optim_math::sgd<T>(hp), p, g, buf);
  check_launch("sgd_step");
}

template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax, cudaStream_t stream) {
  if (n == 0) return;
  adam_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, optim_math::adam<T>(hp), p, g, m, v, vmax);
  check_launch("adam_step");
}

template <class T>
void adam_step_multi(int device, const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp,
                     cudaStream_t stream) {
  // The table, entries then chunks, in one block of bytes.
  std::vector<AdamEntry<T>> entries;
  std::vector<Chunk> chunks;
  for (const AdamTensor<T>& t : tensors) {
    if (t.n == 0) continue;
    const auto entry = static_cast<int64_t>(entries.size());
    entries.push_back({optim_math::adam_at_step<T>(hp, t.step), t.n, t.p, t.g, t.m, t.v, t.vmax});
    for (int64_t start = 0; start < t.n; start += kChunk) chunks.push_back({entry, start});
  }
  if (chunks.empty()) return;
  require(chunks.size() <= (size_t(1) << 31) - 1, "adam_step_multi", "more chunks than one grid holds");
  const size_t entry_bytes = (entries.size() * sizeof(AdamEntry<T>) + 15) / 16 * 16;
  const size_t bytes = entry_bytes + chunks.size() * sizeof(Chunk);
  std::vector<unsigned char> host(bytes);
  std::memcpy(host.data(), entries.data(), entries.size() * sizeof(AdamEntry<T>));
  std::memcpy(host.data() + entry_bytes, chunks.data(), chunks.size() * sizeof(Chunk));
  auto* table = static_cast<unsigned char*>(allocate(device, bytes, stream));
  copy_host_to_device(device, table, host.data(), bytes);  // queued on `stream`: no wait
  adam_multi_kernel<T><<<static_cast<unsigned>(chunks.size()), kThreads, 0, stream>>>(
      reinterpret_cast<const AdamEntry<T>*>(table), reinterpret_cast<const Chunk*>(table + entry_bytes));
  release(table);  // reused only by work queued on `stream` after this kernel
  check_launch("adam_step_multi");
}

template <class T>
void unscale_grad(int64_t n, T* g, T inv_scale, int32_t* found_nonfinite, cudaStream_t stream) {
  if (n == 0) return;
  unscale_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, g, inv_scale, found_nonfinite);
  check_launch("unscale_grad");
}

template void sgd_step<float>(int64_t, const SgdParams&, float*, const float*, float*, cudaStream_t);
template void sgd_step<double>(int64_t, const SgdParams&, double*, const double*, double*, cudaStream_t);
template void adam_step<float>(int64_t, const AdamParams&, float*, const float*, float*, float*, float*,
                               cudaStream_t);
template void adam_step<double>(int64_t, const AdamParams&, double*, const double*, double*, double*, double*,
                                cudaStream_t);
template void adam_step_multi<float>(int, const std::vector<AdamTensor<float>>&, const AdamParams&, cudaStream_t);
template void adam_step_multi<double>(int, const std::vector<AdamTensor<double>>&, const AdamParams&,
                                      cudaStream_t);
template void unscale_grad<float>(int64_t, float*, float, int32_t*, cudaStream_t);
template void unscale_grad<double>(int64_t, double*, double, int32_t*, cudaStream_t);

}  // namespace nd::kernels::cuda
