#include "data/resize.h"

#include <algorithm>
#include <cmath>
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

// A float image, HWC like Image.
struct FloatImage {
  int64_t height, width;
  std::vector<float> values;
};

FloatImage horizontal(const FloatImage& in, int64_t width, InterpolationMode mode) {
  const Taps taps = compute_taps(in.width, width, mode);
  FloatImage out{in.height, width, std::vector<float>(static_cast<size_t>(in.height * width * 3))};
  for (int64_t y = 0; y < in.height; ++y) {
    const float* src = in.values.data() + y * in.width * 3;
    float* dst = out.values.data() + y * width * 3;
    for (int64_t x = 0; x < width; ++x) {
      const float* w = taps.weights.data() + x * taps.max_count;
      const float* s = src + taps.first[x] * 3;
      for (int c = 0; c < 3; ++c) {
        float t = s[c] * w[0];
        for (int64_t j = 1; j < taps.count[x]; ++j) t += s[j * 3 + c] * w[j];
        dst[x * 3 + c] = t;
      }
    }
  }
  return out;
}

FloatImage vertical(const FloatImage& in, int64_t height, InterpolationMode mode) {
  const Taps taps = compute_taps(in.height, height, mode);
  const int64_t row = in.width * 3;
  FloatImage out{height, in.width, std::vector<float>(static_cast<size_t>(height * row))};
  for (int64_t y = 0; y < height; ++y) {
    const float* w = taps.weights.data() + y * taps.max_count;
    const float* src = in.values.data() + taps.first[y] * row;
    float* dst = out.values.data() + y * row;
    for (int64_t k = 0; k < row; ++k) {
      float t = src[k] * w[0];
      for (int64_t j = 1; j < taps.count[y]; ++j) t += src[j * row + k] * w[j];
      dst[k] = t;
    }
  }
  return out;
}

}  // namespace

Image resize(const Image& image, int64_t height, int64_t width, InterpolationMode mode) {
  ND_CHECK(height >= 1 && width >= 1, "Resize: the output size must be at least 1 x 1, got ", width, " x ", height);
  ND_CHECK(image.height >= 1 && image.width >= 1, "Resize: the image is empty (", image.width, " x ", image.height,
           ")");
  if (height == image.height && width == image.width) return image;
  FloatImage f{image.height, image.width, std::vector<float>(image.pixels.begin(), image.pixels.end())};
  // PyTorch's order: the contiguous dimension (width) first, then height; a pass whose size
  // does not change is left out.
  if (width != image.width) f = horizontal(f, width, mode);
  if (height != image.height) f = vertical(f, height, mode);
  Image out(height, width);
  for (size_t i = 0; i < out.pixels.size(); ++i)
    out.pixels[i] = static_cast<uint8_t>(std::nearbyint(std::clamp(f.values[i], 0.0f, 255.0f)));  // half to even
  return out;
}

}  // namespace nd::data
