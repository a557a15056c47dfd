#pragma once
// Emulator stand-in for <cub/device/device_radix_sort.cuh>: exactly what
// kernels/cuda/embedding.cu calls, cub::DeviceRadixSort::SortPairs, on host memory, with
// CUB's documented semantics:
//   - two phases: with d_temp_storage == nullptr it only sets temp_storage_bytes and
//     returns; otherwise temp_storage_bytes must be at least that (else an error) and the
//     storage is used as scratch (here: overwritten with 0xff bytes);
//   - a stable sort by key ascending, comparing only key bits [begin_bit, end_bit) (bits
//     outside the range do not order, they travel with the key), values move with their
//     keys; 0 <= begin_bit < end_bit <= 8 sizeof(KeyT), else an error;
//   - signed keys are ordered as signed (CUB flips the sign bit before comparing);
//   - input and output ranges must not overlap (not supported in place);
//   - returns cudaSuccess (0), or cudaErrorInvalidValue (1) for a bad argument.
// It checks the arguments and semantics of our calls, not CUB itself. Runs synchronously.
#include <algorithm>

#include "emu_sanitizer.h"
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"

namespace cub {

struct DeviceRadixSort {
  template <class KeyT, class ValueT, class NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out,
                               NumItemsT num_items, int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                               cudaStream_t stream = 0) {
    static_assert(std::is_integral_v<KeyT>, "the emulated SortPairs handles integer keys only");
    (void)stream;
    constexpr cudaError_t kInvalidValue = cudaErrorInvalidValue;
    const int64_t n = static_cast<int64_t>(num_items);
    const size_t required = 256 + static_cast<size_t>(n > 0 ? n : 0) * (sizeof(KeyT) + sizeof(ValueT));
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = required;
      return cudaSuccess;
    }
    if (n < 0 || temp_storage_bytes < required || begin_bit < 0 || end_bit > int(sizeof(KeyT) * 8) ||
        begin_bit >= end_bit)
      return kInvalidValue;
    auto overlap = [](const void* a, size_t na, const void* b, size_t nb) {
      const auto* pa = static_cast<const char*>(a);
      const auto* pb = static_cast<const char*>(b);
      return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
    };
    const size_t kb = sizeof(KeyT) * n, vb = sizeof(ValueT) * n;
    if (overlap(d_keys_in, kb, d_keys_out, kb) || overlap(d_values_in, vb, d_values_out, vb)) return kInvalidValue;
    std::memset(d_temp_storage, 0xff, temp_storage_bytes);
    using U = std::make_unsigned_t<KeyT>;
    auto digit = [&](KeyT key) {
      U u = static_cast<U>(key);
      if constexpr (std::is_signed_v<KeyT>) u ^= U(1) << (sizeof(KeyT) * 8 - 1);
      u >>= begin_bit;
      const int width = end_bit - begin_bit;
      if (width < int(sizeof(U) * 8)) u &= (U(1) << width) - 1;
      return u;
    };
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return digit(d_keys_in[a]) < digit(d_keys_in[b]); });
    for (int64_t i = 0; i < n; ++i) {
      d_keys_out[i] = d_keys_in[order[i]];
      d_values_out[i] = d_values_in[order[i]];
    }
    emu_san::host_wrote(d_keys_out, kb);  // scratch the sort fills counts as written
    emu_san::host_wrote(d_values_out, vb);
    return cudaSuccess;
  }
};

}  // namespace cub
