#include "engine/factories.h"

#include <cmath>
#include <limits>

#include "engine/error.h"
#include "engine/ops/common.h"
#include "engine/ops/copy.h"
#include "kernels/common/counter_rng.h"
#include "kernels/cpu/copy.h"

namespace nd {

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator() = Generator{seed, 0}; }

Tensor empty(const Shape& shape, TensorOptions options) {
  int64_t n = 1;
  for (int64_t d : shape) {
    ND_CHECK(d >= 0, "empty: negative dimension ", d, " in shape ", shape_str(shape));
    ND_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / 8 / d, "empty: shape ", shape_str(shape),
             " has too many elements");
    n *= d;
  }
  cuda::check_device(options.device_);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(n) * element_size(options.dtype_), options.device_,
                                            options.pinned_memory_);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype_;
  Tensor t(impl);
  if (options.requires_grad_) t.requires_grad_(true);
  return t;
}

uint64_t random_bits(uint64_t seed, uint64_t counter) { return kernels::counter_hash(seed, counter); }
double random_uniform(uint64_t seed, uint64_t counter) { return kernels::counter_uniform(seed, counter); }

// Fills on the CPU and moves the result: device factories of host-made values (tensor,
// arange, rand, randn) reuse the copy path.
namespace {
template <class Fill>
Tensor make_on_cpu(const Shape& shape, TensorOptions options, Fill&& fill) {
  TensorOptions cpu_opts = options.device(Device(kCPU)).requires_grad(false);
  Tensor t = empty(shape, cpu_opts);
  fill(t);
  if (!options.device_.is_cpu()) t = t.to(options.device_);
  if (options.requires_grad_) t.requires_grad_(true);
  return t;
}
}  // namespace

// Filled where it lives: on a GPU by a kernel on the compute stream, so that a constant
// (every `x * 2.0` makes one) costs no copy and no wait for the device.
Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor t = empty(shape, options.requires_grad(false));
  fill_data(t, value);
  if (options.requires_grad_) t.requires_grad_(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1, options); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }
Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor tensor(const std::vector<double>& values, TensorOptions options) {
  return make_on_cpu({static_cast<int64_t>(values.size())}, options, [&](Tensor& t) {
    Shape shape{t.numel()}, one{1};
    dispatch_all(t.dtype(), [&]<class T>() {
      kernels::cpu::copy_strided<double, T>(1, shape.data(), values.data(), one.data(), t.data_ptr<T>(), one.data());
    });
  });
}

Tensor arange(double start, double end, double step, TensorOptions options) {
  ND_CHECK(step != 0, "arange: step must be nonzero");
  ND_CHECK((end - start) / step >= 0, "arange: upper bound and larger bound inconsistent with step sign (start=",
           start, ", end=", end, ", step=", step, ")");
  const int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = start + step * static_cast<double>(i);
  return tensor(values, options);
}
Tensor arange(double end, TensorOptions options) { return arange(0, end, 1, options); }

namespace {
// Draws n doubles with draw(seed, counter) and advances the generator.
template <class Draw>
Tensor random_tensor(const Shape& shape, TensorOptions options, Generator* gen, uint64_t counters_per_value,
                     Draw&& draw) {
  Generator& g = gen ? *gen : default_generator();
  return make_on_cpu(shape, options, [&](Tensor& t) {
    const int64_t n = t.numel();
    std::vector<double> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = draw(g.seed, g.offset + counters_per_value * static_cast<uint64_t>(i));
    g.offset += counters_per_value * static_cast<uint64_t>(n);
    Shape flat{n}, one{1};
    dispatch_all(t.dtype(), [&]<class T>() {
      kernels::cpu::copy_strided<double, T>(1, flat.data(), v.data(), one.data(), t.data_ptr<T>(), one.data());
    });
  });
}
}  // namespace

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  ND_CHECK(is_floating_point(options.dtype_), "randn: expected a floating point dtype, found ",
           dtype_name(options.dtype_));
  // Box-Muller: z = sqrt(-2 ln(1 - u1)) cos(2 pi u2).
  return random_tensor(shape, options, gen, 2, [](uint64_t seed, uint64_t c) {
    const double u1 = kernels::counter_uniform(seed, c), u2 = kernels::counter_uniform(seed, c + 1);
    return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * M_PI * u2);
  });
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  ND_CHECK(is_floating_point(options.dtype_), "rand: expected a floating point dtype, found ",
           dtype_name(options.dtype_));
  return random_tensor(shape, options, gen, 1, [](uint64_t seed, uint64_t c) { return kernels::counter_uniform(seed, c); });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  ND_CHECK(low < high, "randint: expected low < high, found low=", low, ", high=", high);
  const uint64_t range = static_cast<uint64_t>(high - low);
  return random_tensor(shape, options, gen, 1, [=](uint64_t seed, uint64_t c) {
    return static_cast<double>(low + static_cast<int64_t>(kernels::counter_hash(seed, c) % range));
  });
}

}  // namespace nd
