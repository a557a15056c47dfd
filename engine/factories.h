#pragma once
// Tensor factories and the seeded random generator (LibTorch names).
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace nd {

// Counter-based generator: state is (seed, offset); draw i of a call uses counter
// offset + i, so the same seed gives the same numbers on every run and device.
struct Generator {
  uint64_t seed = 0;
  uint64_t offset = 0;
};
Generator& default_generator();
void manual_seed(uint64_t seed);
// Value `counter` of the counter-based stream `seed` (pure functions: the generator's own
// hash), for code that draws on the host by position: the samplers' and the DataLoader's
// shuffles, the transforms' random parameters. 64 random bits, or uniform in [0, 1) (53 bits).
uint64_t random_bits(uint64_t seed, uint64_t counter);
double random_uniform(uint64_t seed, uint64_t counter);

Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
// 0-d tensor holding `value`.
Tensor scalar_tensor(double value, TensorOptions options = {});
// 1-D tensor from values (converted to options' dtype).
Tensor tensor(const std::vector<double>& values, TensorOptions options = {});
// [start, end) with step; dtype from options.
Tensor arange(double start, double end, double step = 1, TensorOptions options = {});
Tensor arange(double end, TensorOptions options = {});
// Standard normal / uniform [0, 1) / integers in [low, high), from `gen` (default generator if null).
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = TensorOptions(kInt64),
               Generator* gen = nullptr);

}  // namespace nd
