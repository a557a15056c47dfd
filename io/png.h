#pragma once
// PNG encoding, as torchvision.io.encode_png: a u8 [C, H, W] image (C = 1 gray, 3 RGB,
// 4 RGBA) becomes the bytes of a PNG file: signature, IHDR, one IDAT of filter-0
// scanlines deflated by zlib, IEND, each chunk with zlib's CRC-32. SummaryWriter's
// images and the apps' sample grids and plots use it.
// Tests: tests/tensorboard/tensorboard_test.cpp and tests/apps (which decode it).
#include <string>

#include "engine/tensor.h"

namespace nd {

// The PNG file's bytes (torchvision returns them as a u8 tensor; here a string). Any
// layout and device. Throws nd::Error for another dtype, rank or channel count.
std::string encode_png(const Tensor& image);

}  // namespace nd
