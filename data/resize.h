#pragma once
// Antialiased image resizing as torchvision's Resize does it on a uint8 tensor (its tensor
// path, not its PIL path, which differs by up to 29 levels on hard edges): the image in
// float, a horizontal and a vertical pass (each only when that size changes), each output
// sample a normalised weighted sum of the input samples under a filter stretched by the
// downscaling factor (PyTorch's _upsample_bilinear2d_aa / _upsample_bicubic2d_aa, CPU:
// UpSampleKernel.cpp's _compute_indices_min_size_weights_aa), no rounding between the
// passes, then clamped to [0, 255] and rounded half to even. PyTorch always runs the
// horizontal pass first; here the pass that leaves the smaller intermediate image goes
// first (a 400x300 photo to 85x64: the vertical one, 4.7 times less work for the second
// pass), which changes only the float rounding of the sums.
// Tests: tests/data/transforms_test.cpp (against torchvision, within 1 level).
#include <cstdint>

#include "data/image.h"

namespace nd::data {

enum class InterpolationMode { kBilinear, kBicubic };  // torchvision's BILINEAR, BICUBIC (a = -0.5)

// `image` resized to height x width (both >= 1).
Image resize(const Image& image, int64_t height, int64_t width, InterpolationMode mode);

}  // namespace nd::data
