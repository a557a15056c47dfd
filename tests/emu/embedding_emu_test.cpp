// kernels/cuda/embedding.cu in the emulator against kernels/cpu/embedding.cpp. The forward
// is a gather and its bad-index report a position: both exact. The backward sorts the
// indices with CUB (the stand-in include/cub/device/device_radix_sort.cuh: CUB's
// documented two-phase call, stable, only key bits [begin_bit, end_bit) compared) and adds
// each row's gradient rows in index-position order from 0, the CPU's order: bit-equal.
// The stand-in checks our call's arguments and semantics (a too-narrow end_bit would
// order keys wrongly), not CUB itself.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <cub/device/device_radix_sort.cuh>

#include "emu_test.h"
#include "engine/error.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

// n indices in [0, num), seeded, with the largest one (num - 1) and repeats.
std::vector<int64_t> indices_for(int64_t n, int64_t num, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> u(0, num - 1);
  std::vector<int64_t> idx(n);
  for (auto& i : idx) i = u(gen);
  if (n > 0) idx[n / 2] = num - 1;
  if (n > 2) idx[n - 1] = idx[0];
  return idx;
}

template <class T>
void check_embedding(int64_t num, int64_t D, int64_t n, int64_t padding_idx, unsigned seed) {
  INFO("num_embeddings ", num, " D ", D, " n ", n, " padding_idx ", padding_idx, sizeof(T) == 4 ? " f32" : " f64");
  const auto weight = cast<T>(uniform(num * D, seed)), dout = cast<T>(uniform(n * D, seed + 1, -4.0, 4.0));
  const auto idx = indices_for(n, num, seed + 2);

  std::vector<T> out_cpu(n * D);
  auto out_emu = nans<T>(n * D);
  CHECK(cpu::embedding_forward<T>(weight.data(), num, D, idx.data(), n, out_cpu.data()) == -1);
  CHECK(cuda::embedding_forward<T>(weight.data(), num, D, idx.data(), n, out_emu.data(), nullptr) == -1);
  check_equal("forward", out_emu, out_cpu);

  std::vector<T> dw_cpu(num * D);
  auto dw_emu = nans<T>(num * D);
  cpu::embedding_backward<T>(dout.data(), idx.data(), n, num, D, padding_idx, dw_cpu.data());
  cuda::embedding_backward<T>(dout.data(), idx.data(), n, num, D, padding_idx, dw_emu.data(), nullptr);
  check_equal("backward", dw_emu, dw_cpu);
  if (padding_idx >= 0)
    for (int64_t d = 0; d < D; ++d) CHECK(dw_emu[padding_idx * D + d] == T(0));
}

TEST_CASE("embedding forward and backward, bit-equal: repeated indices, padding_idx, key widths") {
  check_embedding<float>(1, 3, 5, -1, 1);       // one row: end_bit 1, every index 0
  check_embedding<float>(2, 1, 9, -1, 2);       // D = 1
  check_embedding<float>(10, 7, 40, 3, 3);      // padding_idx, many repeats
  check_embedding<float>(1000, 5, 300, -1, 4);  // 10 key bits: a sort on too few bits misorders
  check_embedding<float>(1025, 2, 200, 1024, 5);  // 11 key bits, padding_idx the last row
  check_embedding<float>(6, 300, 20, 0, 6);     // D beyond one block's threads
  check_embedding<double>(10, 7, 40, 3, 7);
  check_embedding<double>(513, 3, 100, -1, 8);
}

TEST_CASE("embedding backward with no indices writes zeros and the forward reports the first bad index") {
  std::vector<float> dw = nans<float>(4 * 3), dout;
  cuda::embedding_backward<float>(dout.data(), nullptr, 0, 4, 3, -1, dw.data(), nullptr);
  for (float x : dw) CHECK(x == 0.0f);

  const auto weight = uniform(4 * 3, 1);
  const std::vector<int64_t> idx = {0, 3, 4, 1, -1};
  auto out = nans<float>(idx.size() * 3);
  std::vector<float> out_cpu(idx.size() * 3);
  const int64_t cpu_bad = cpu::embedding_forward<float>(weight.data(), 4, 3, idx.data(), 5, out_cpu.data());
  CHECK(cpu_bad == 2);
  CHECK(cuda::embedding_forward<float>(weight.data(), 4, 3, idx.data(), 5, out.data(), nullptr) == cpu_bad);
  for (float x : out) CHECK(std::isnan(x));  // nothing written
  const std::vector<int64_t> negative = {0, -2};
  CHECK(cuda::embedding_forward<float>(weight.data(), 4, 3, negative.data(), 2, out.data(), nullptr) == 1);
}

// The stand-in itself, as CUB documents SortPairs (what the backward above relies on).
TEST_CASE("cub::DeviceRadixSort::SortPairs stand-in: size query, stability, bit range, errors") {
  const std::vector<uint64_t> keys = {5, 2, 5, 0x102, 2, 1, 0x105};
  const std::vector<int64_t> vals = {0, 1, 2, 3, 4, 5, 6};
  std::vector<uint64_t> keys_out(keys.size(), 99);
  std::vector<int64_t> vals_out(vals.size(), 99);
  size_t bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys.data(), keys_out.data(), vals.data(), vals_out.data(),
                                          7, 0, 64) == cudaSuccess);
  CHECK(bytes > 0);
  CHECK(keys_out == std::vector<uint64_t>(7, 99));  // the query sorts nothing
  std::vector<char> temp(bytes);
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys_out.data(), vals.data(),
                                          vals_out.data(), 7, 0, 64) == cudaSuccess);
  CHECK(keys_out == std::vector<uint64_t>{1, 2, 2, 5, 5, 0x102, 0x105});
  CHECK(vals_out == std::vector<int64_t>{5, 1, 4, 0, 2, 3, 6});  // stable
  // Bits [0, 8) only: 0x102 and 0x105 order as 2 and 5, after the earlier equal keys.
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys_out.data(), vals.data(),
                                          vals_out.data(), 7, 0, 8) == cudaSuccess);
  CHECK(keys_out == std::vector<uint64_t>{1, 2, 0x102, 2, 5, 5, 0x105});
  CHECK(vals_out == std::vector<int64_t>{5, 1, 3, 4, 0, 2, 6});
  size_t small = bytes - 1;
  CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), small, keys.data(), keys_out.data(), vals.data(),
                                        vals_out.data(), 7, 0, 64) != cudaSuccess);
  CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys_out.data(), vals.data(),
                                        vals_out.data(), 7, 0, 65) != cudaSuccess);
  std::vector<uint64_t> inplace = keys;
  CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, inplace.data(), inplace.data(), vals.data(),
                                        vals_out.data(), 7, 0, 64) != cudaSuccess);
}

}  // namespace
