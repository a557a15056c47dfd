#pragma once
// Counter-based random numbers: value i of a stream is a pure function of
// (seed, offset + i). CPU and CUDA therefore draw identical numbers, and a
// generator's whole state is two integers (easy to checkpoint).
#include <cstdint>

#include "kernels/common/host_device.h"

namespace nd::kernels {

// splitmix64 finaliser over seed and counter: a strong 64-bit mix, cheap on both sides.
ND_HOST_DEVICE uint64_t counter_hash(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 32);
}

// Uniform in [0, 1) with 53 random bits.
ND_HOST_DEVICE double counter_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(counter_hash(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace nd::kernels
