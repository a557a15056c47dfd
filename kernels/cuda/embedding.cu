// Embedding: the forward validates the indices on the device (rows::first_invalid_index)
// and gathers one element per thread. The backward is a scatter-add with write conflicts
// on repeated indices; float atomics would add in a different order each run, so instead:
//   1. sort the (index, position) pairs by index with CUB's radix sort, which is stable:
//      within one index the positions stay increasing;
//   2. one block per table row r finds r's run of sorted indices by binary search
//      (kernels/common/sorted_search.h) and each thread sums its columns of the run's
//      gradient rows in that order, starting from 0, in T: the CPU twin's exact sequence
//      of additions, so the two agree bit for bit.
#include "kernels/cuda/embedding.h"

#include <cub/device/device_radix_sort.cuh>

#include "kernels/common/sorted_search.h"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

template <class T>
__global__ void embedding_forward_kernel(const T* weight, int64_t D, const int64_t* indices, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * D; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = weight[indices[i / D] * D + i % D];
}

__global__ void iota_kernel(int64_t n, int64_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = i;
}

// sorted_keys[0..n) ascending, positions[k] the index position sorted_keys[k] came from.
template <class T>
__global__ void embedding_backward_kernel(const T* dout, const uint64_t* sorted_keys, const int64_t* positions,
                                          int64_t n, int64_t num_embeddings, int64_t D, int64_t padding_idx,
                                          T* dweight) {
  for (int64_t r = blockIdx.x; r < num_embeddings; r += gridDim.x) {
    const uint64_t key = static_cast<uint64_t>(r);
    const int64_t begin = lower_bound(sorted_keys, n, key);
    const int64_t end = r == padding_idx ? begin : lower_bound(sorted_keys, n, key + 1);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      T acc = 0;
      for (int64_t k = begin; k < end; ++k) acc += dout[positions[k] * D + d];
      dweight[r * D + d] = acc;
    }
  }
}

// Key bits the sort needs to look at: enough for num_embeddings - 1.
int key_bits(int64_t num_embeddings) {
  int bits = 1;
  while (bits < 63 && (int64_t(1) << bits) < num_embeddings) ++bits;
  return bits;
}

}  // namespace

template <typename T>
int64_t embedding_forward(const T* weight, int64_t num_embeddings, int64_t D, const int64_t* indices, int64_t n,
                          T* out, cudaStream_t stream) {
  const int64_t bad = rows::first_invalid_index(indices, n, num_embeddings, false, 0, stream, "embedding_forward");
  if (bad >= 0 || n * D == 0) return bad;
  embedding_forward_kernel<T>
      <<<detail::blocks_for(n * D), detail::kThreads, 0, stream>>>(weight, D, indices, n, out);
  check_launch("embedding_forward");
  return -1;
}

template <typename T>
void embedding_backward(const T* dout, const int64_t* indices, int64_t n, int64_t num_embeddings, int64_t D,
                        int64_t padding_idx, T* dweight, cudaStream_t stream) {
  const char* kernel = "embedding_backward";
  if (num_embeddings * D == 0) return;
  require(n < (int64_t(1) << 31), kernel, "at most 2^31 - 1 indices per call, found " + std::to_string(n));
  const int num_items = static_cast<int>(n);
  const int end_bit = key_bits(num_embeddings);
  // Indices are in [0, num_embeddings) (the forward checked), so as unsigned keys they sort the same.
  const auto* keys_in = reinterpret_cast<const uint64_t*>(indices);
  const size_t bytes = sizeof(int64_t) * static_cast<size_t>(n);
  detail::Scratch keys(kernel, bytes, stream), positions_in(kernel, bytes, stream), positions(kernel, bytes, stream);
  if (n > 0) {
    size_t temp_bytes = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys.as<uint64_t>(),
                                          positions_in.as<int64_t>(), positions.as<int64_t>(), num_items, 0, end_bit,
                                          stream),
          "cub::DeviceRadixSort::SortPairs (size query)", kernel);
    detail::Scratch temp(kernel, temp_bytes, stream);
    iota_kernel<<<detail::blocks_for(n), detail::kThreads, 0, stream>>>(n, positions_in.as<int64_t>());
    check_launch(kernel);
    check(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys.as<uint64_t>(),
                                          positions_in.as<int64_t>(), positions.as<int64_t>(), num_items, 0, end_bit,
                                          stream),
          "cub::DeviceRadixSort::SortPairs", kernel);
  }
  embedding_backward_kernel<T><<<rows::blocks_for(num_embeddings), rows::threads_for(D), 0, stream>>>(
      dout, keys.as<uint64_t>(), positions.as<int64_t>(), n, num_embeddings, D, padding_idx, dweight);
  check_launch(kernel);
}

#define ND_INSTANTIATE(T) \
  template int64_t embedding_forward<T>(const T*, int64_t, int64_t, const int64_t*, int64_t, T*, cudaStream_t); \
  template void embedding_backward<T>(const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t, T*, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
