// Fused multi-tensor optimizer steps: every element of every tensor read once and written
// once, with the CPU's per-element update (kernels/common/optim_math.h); the coefficients
// and bias corrections are computed once per tensor on the host, into a table of entries
// and chunks that one launch works through, a block per chunk.
#include "kernels/cuda/optim.h"

#include <cstring>

#include "kernels/common/optim_math.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;
using optim_math::Chunk;

template <class Entry>
__global__ void multi_tensor_kernel(const Entry* entries, const Chunk* chunks) {
  const Chunk chunk = chunks[blockIdx.x];
  const Entry& e = entries[chunk.entry];
  const int64_t end = chunk.start + optim_math::kChunk < e.n ? chunk.start + optim_math::kChunk : e.n;
  for (int64_t i = chunk.start + threadIdx.x; i < end; i += blockDim.x) e.update(i);
}

// The table, entries then chunks, in one block of device memory, then one launch.
template <class Entry>
void launch_multi_tensor(int device, const std::vector<Entry>& entries, const char* op, cudaStream_t stream) {
  const std::vector<Chunk> chunks = optim_math::chunks_of(entries);
  if (chunks.empty()) return;
  require(chunks.size() <= (size_t(1) << 31) - 1, op, "more chunks than one grid holds");
  const size_t entry_bytes = (entries.size() * sizeof(Entry) + 15) / 16 * 16;
  const size_t bytes = entry_bytes + chunks.size() * sizeof(Chunk);
  std::vector<unsigned char> host(bytes);
  std::memcpy(host.data(), entries.data(), entries.size() * sizeof(Entry));
  std::memcpy(host.data() + entry_bytes, chunks.data(), chunks.size() * sizeof(Chunk));
  auto* table = static_cast<unsigned char*>(allocate(device, bytes, stream));
  copy_host_to_device(device, table, host.data(), bytes);  // queued on `stream`: no wait
  multi_tensor_kernel<Entry><<<static_cast<unsigned>(chunks.size()), kThreads, 0, stream>>>(
      reinterpret_cast<const Entry*>(table), reinterpret_cast<const Chunk*>(table + entry_bytes));
  release(table);  // reused only by work queued on `stream` after this kernel
  check_launch(op);
}

// Every thread that sees a non-finite value stores the same 1: the flag ends the same
// whichever thread wins, so no atomic is needed.
template <class T>
struct UnscaleEntry {
  int64_t n;
  T* g;
  T inv_scale;
  int32_t* found;
  ND_HOST_DEVICE void update(int64_t i) const {
    const T x = g[i];
    if (!(x - x == T(0))) *found = 1;  // x - x is 0 for a finite x, NaN for inf or NaN
    g[i] = x * inv_scale;
  }
};

}  // namespace

template <class T>
void sgd_step(int device, const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp, cudaStream_t stream) {
  launch_multi_tensor(device, optim_math::sgd_entries(tensors, hp), "sgd_step", stream);
}

template <class T>
void adam_step(int device, const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp, cudaStream_t stream) {
  launch_multi_tensor(device, optim_math::adam_entries(tensors, hp), "adam_step", stream);
}

template <class T>
void unscale_grad(int device, const std::vector<UnscaleTensor<T>>& tensors, T inv_scale, cudaStream_t stream) {
  std::vector<UnscaleEntry<T>> entries;
  for (const UnscaleTensor<T>& t : tensors)
    if (t.n > 0) entries.push_back({t.n, t.g, inv_scale, t.found_nonfinite});
  launch_multi_tensor(device, entries, "unscale_grad", stream);
}

template void sgd_step<float>(int, const std::vector<SgdTensor<float>>&, const SgdParams&, cudaStream_t);
template void sgd_step<double>(int, const std::vector<SgdTensor<double>>&, const SgdParams&, cudaStream_t);
template void adam_step<float>(int, const std::vector<AdamTensor<float>>&, const AdamParams&, cudaStream_t);
template void adam_step<double>(int, const std::vector<AdamTensor<double>>&, const AdamParams&, cudaStream_t);
template void unscale_grad<float>(int, const std::vector<UnscaleTensor<float>>&, float, cudaStream_t);
template void unscale_grad<double>(int, const std::vector<UnscaleTensor<double>>&, double, cudaStream_t);

}  // namespace nd::kernels::cuda
