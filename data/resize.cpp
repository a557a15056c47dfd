#include "data/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <vector>

#include "engine/error.h"

namespace nd::data {

namespace {

// The filters, as PyTorch writes them (x already divided by the downscaling factor).
float bilinear_filter(float x) {
  x = std::abs(x);
  return x < 1 ? 1 - x : 0;
}
// Keys' cubic convolution with a = -0.5 (PIL's choice, which PyTorch keeps for antialiasing).
float bicubic_filter(float x) {
  constexpr float a = -0.5f;
  x = std::abs(x);
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0;
}

// For each output index along one axis: the first input index, how many it reads, and their
// normalised weights (PyTorch's _compute_indices_min_size_weights_aa, its float arithmetic
// included: center and the filter's argument mix float and double as it does).
struct Taps {
  std::vector<int64_t> first, count;
  std::vector<float> weights;  // max_count per output index
  int64_t max_count = 0;
};

Taps compute_taps(int64_t in, int64_t out, InterpolationMode mode) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float half_width = mode == InterpolationMode::kBilinear ? 1.0f : 2.0f;  // interp_size / 2
  const float support = scale >= 1 ? half_width * scale : half_width;
  const float invscale = scale >= 1 ? 1 / scale : 1;
  const auto filter = mode == InterpolationMode::kBilinear ? bilinear_filter : bicubic_filter;
  Taps taps;
  taps.max_count = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out);
  taps.count.resize(out);
  taps.weights.assign(static_cast<size_t>(out * taps.max_count), 0.0f);
  for (int64_t i = 0; i < out; ++i) {
    const float center = scale * (static_cast<float>(i) + 0.5f);
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    const int64_t xsize =
        std::clamp(std::min(static_cast<int64_t>(center + support + 0.5), in) - xmin, int64_t{0}, taps.max_count);
    float* w = taps.weights.data() + i * taps.max_count;
    float total = 0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = filter(static_cast<float>((static_cast<float>(j + xmin) - center + 0.5) * invscale));
      total += w[j];
    }
    if (total != 0)
      for (int64_t j = 0; j < xsize; ++j) w[j] /= total;
    taps.first[i] = xmin;
    taps.count[i] = xsize;
  }
  return taps;
}

// Sixteen floats in one vector (GCC / Clang vector extensions; the compiler splits it where
// registers are narrower).
using Floats16 = float __attribute__((vector_size(64)));

// Sixteen bytes as floats: AVX-512's widening conversions where the build targets it (GCC 12
// converts a vector of bytes one element at a time), a plain loop otherwise.
#if defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's false positive inside its AVX-512 headers
#endif
void bytes_to_floats(const uint8_t* bytes, Floats16& out) {
#if defined(__AVX512F__)
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes))));
  std::memcpy(&out, &f, sizeof out);
#else
  for (int k = 0; k < 16; ++k) out[k] = bytes[k];
#endif
}
#if defined(__AVX512F__)
#pragma GCC diagnostic pop
#endif


template <class T>
float as_float(T v) {
  return static_cast<float>(v);
}

// One pass along the outer dimension of `in` (rows of `length` values, uint8 or float)
// into `out`, one row per output index of `taps`: output row i is the weighted sum of input
// rows first_i .. first_i + count_i - 1. Each element is summed in tap order as PyTorch
// sums it (t = s0 * w0, then t += s_j * w_j), sixteen elements at a time in a vector
// register.
template <class T>
void filter_rows(const Taps& taps, const T* in, int64_t length, float* out) {
  constexpr int64_t kChunk = 16;
  for (size_t i = 0; i < taps.first.size(); ++i) {
    float* dst = out + static_cast<int64_t>(i) * length;
    const int64_t count = taps.count[i];
    if (count == 0) {
      std::fill(dst, dst + length, 0.0f);
      continue;
    }
    const float* w = taps.weights.data() + static_cast<int64_t>(i) * taps.max_count;
    const T* src = in + taps.first[i] * length;
    int64_t k0 = 0;
    for (; k0 + kChunk <= length; k0 += kChunk) {
      Floats16 sum = {}, v;
      for (int64_t j = 0; j < count; ++j) {
        const T* s = src + j * length + k0;
        if constexpr (std::is_same_v<T, uint8_t>) {
          bytes_to_floats(s, v);
        } else {
          std::memcpy(&v, s, sizeof v);
        }
        if (j == 0) sum = v * w[0];
        else sum += v * w[j];
      }
      std::memcpy(dst + k0, &sum, sizeof sum);
    }
    for (int64_t k = k0; k < length; ++k) {
      float sum = as_float(src[k]) * w[0];
      for (int64_t j = 1; j < count; ++j) sum += as_float(src[j * length + k]) * w[j];
      dst[k] = sum;
    }
  }
}

// Scratch memory of the calling thread, kept between calls: a loader's worker resizes one
// image after another, and fresh buffers of this size would each be mmapped, zeroed and
// page-faulted in. Grows, never shrinks; its contents are undefined.
float* scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// The width pass over `height` rows of `in_width` pixels (3 values each, uint8 or float)
// into `out`, [height][width][3] floats. Rows go through in blocks of kBlock, each
// transposed into a small buffer (its columns become rows of kBlock * 3 values) so that
// filter_rows runs along contiguous memory, then transposed back; the buffers stay in cache.
template <class T>
void width_pass(const T* in, int64_t height, int64_t in_width, int64_t width, InterpolationMode mode, float* out) {
  constexpr int64_t kBlock = 16;
  const Taps taps = compute_taps(in_width, width, mode);
  std::vector<T> block(static_cast<size_t>(in_width * kBlock * 3));
  float* filtered = scratch(2, width * kBlock * 3);
  for (int64_t y0 = 0; y0 < height; y0 += kBlock) {
    const int64_t rows = std::min(kBlock, height - y0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = in + (y0 + r) * in_width * 3;
      for (int64_t x = 0; x < in_width; ++x)
        for (int c = 0; c < 3; ++c) block[(x * rows + r) * 3 + c] = src[x * 3 + c];
    }
    filter_rows(taps, block.data(), rows * 3, filtered);
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = out + (y0 + r) * width * 3;
      for (int64_t x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c) dst[x * 3 + c] = filtered[(x * rows + r) * 3 + c];
    }
  }
}

// The height pass over `in_height` rows of `row` values (uint8 or float) into `height` rows.
template <class T>
void height_pass(const T* in, int64_t in_height, int64_t row, int64_t height, InterpolationMode mode, float* out) {
  filter_rows(compute_taps(in_height, height, mode), in, row, out);
}

}  // namespace

Image resize(const Image& image, int64_t height, int64_t width, InterpolationMode mode) {
  ND_CHECK(height >= 1 && width >= 1, "Resize: the output size must be at least 1 x 1, got ", width, " x ", height);
  ND_CHECK(image.height >= 1 && image.width >= 1, "Resize: the image is empty (", image.width, " x ", image.height,
           ")");
  if (height == image.height && width == image.width) return image;
  // Two passes, the one that leaves the smaller intermediate image first (PyTorch always
  // runs the width pass first; the order changes only the float rounding of the sums).
  const uint8_t* pixels = image.pixels.data();
  float* f = scratch(0, height * width * 3);
  if (width == image.width) {
    height_pass(pixels, image.height, image.width * 3, height, mode, f);
  } else if (height == image.height) {
    width_pass(pixels, image.height, image.width, width, mode, f);
  } else if (height * image.width < image.height * width) {
    float* g = scratch(1, height * image.width * 3);
    height_pass(pixels, image.height, image.width * 3, height, mode, g);
    width_pass(g, height, image.width, width, mode, f);
  } else {
    float* g = scratch(1, image.height * width * 3);
    width_pass(pixels, image.height, image.width, width, mode, g);
    height_pass(g, image.height, width * 3, height, mode, f);
  }
  Image out(height, width);
  for (size_t i = 0; i < out.pixels.size(); ++i)
    out.pixels[i] = static_cast<uint8_t>(std::nearbyint(std::clamp(f[i], 0.0f, 255.0f)));  // half to even
  return out;
}

}  // namespace nd::data
