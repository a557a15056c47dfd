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

// One pass along the outer dimension of `in` (rows of `length` floats) into `out`, one row per
// output index of `taps`: output row i is the weighted sum of input rows first_i ..
// first_i + count_i - 1. Each element is summed in tap order as PyTorch sums it
// (t = s0 * w0, then t += s_j * w_j); the loop over a row's elements is innermost, so it
// vectorises.
void filter_rows(const Taps& taps, const float* in, int64_t length, float* out) {
  for (size_t i = 0; i < taps.first.size(); ++i) {
    float* dst = out + static_cast<int64_t>(i) * length;
    if (taps.count[i] == 0) {
      std::fill(dst, dst + length, 0.0f);
      continue;
    }
    const float* w = taps.weights.data() + static_cast<int64_t>(i) * taps.max_count;
    const float* src = in + taps.first[i] * length;
    for (int64_t k = 0; k < length; ++k) dst[k] = src[k] * w[0];
    for (int64_t j = 1; j < taps.count[i]; ++j) {
      const float* s = src + j * length;
      const float wj = w[j];
      for (int64_t k = 0; k < length; ++k) dst[k] += s[k] * wj;
    }
  }
}

// The width pass, [H][W][3] uint8 -> [H][width][3] float. Rows go through in blocks of
// kBlock, each transposed into a small buffer (its columns become rows of kBlock * 3 floats)
// so that filter_rows runs along contiguous memory, then transposed back; the buffers stay
// in cache and nothing image-sized is allocated but the result.
std::vector<float> width_pass(const Image& image, int64_t width, InterpolationMode mode) {
  constexpr int64_t kBlock = 16;
  const Taps taps = compute_taps(image.width, width, mode);
  std::vector<float> out(static_cast<size_t>(image.height * width * 3));
  std::vector<float> block(static_cast<size_t>(image.width * kBlock * 3)), filtered(static_cast<size_t>(width * kBlock * 3));
  for (int64_t y0 = 0; y0 < image.height; y0 += kBlock) {
    const int64_t rows = std::min(kBlock, image.height - y0);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* src = image.row(y0 + r);
      for (int64_t x = 0; x < image.width; ++x)
        for (int c = 0; c < 3; ++c) block[(x * rows + r) * 3 + c] = src[x * 3 + c];
    }
    filter_rows(taps, block.data(), rows * 3, filtered.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = out.data() + (y0 + r) * width * 3;
      for (int64_t x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c) dst[x * 3 + c] = filtered[(x * rows + r) * 3 + c];
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
  // PyTorch's order: the contiguous dimension (width) first, then height; a pass whose size
  // does not change is left out.
  std::vector<float> f = width != image.width ? width_pass(image, width, mode)
                                              : std::vector<float>(image.pixels.begin(), image.pixels.end());
  if (height != image.height) {
    std::vector<float> g(static_cast<size_t>(height * width * 3));
    filter_rows(compute_taps(image.height, height, mode), f.data(), width * 3, g.data());
    f = std::move(g);
  }
  Image out(height, width);
  for (size_t i = 0; i < out.pixels.size(); ++i)
    out.pixels[i] = static_cast<uint8_t>(std::nearbyint(std::clamp(f[i], 0.0f, 255.0f)));  // half to even
  return out;
}

}  // namespace nd::data
