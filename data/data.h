#pragma once
// Datasets on disk: the IDX format of MNIST / Fashion-MNIST, gzip-compressed or plain.
// Every malformed input (missing or truncated file, wrong magic number, sizes that do
// not match the bytes, images/labels count mismatch) is an nd::Error naming the file,
// what was expected and what was found. Tests: tests/data/idx_test.cpp.
#include <string>

#include "engine/tensor.h"

namespace nd::data {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct Dataset {
  Tensor images;  // [N, 1, 28, 28] f32, pixels p in 0..255 mapped to p / 127.5 - 1 in [-1, 1]
  Tensor labels;  // [N] i64, class indices in [0, 10)
};

// Reads an unsigned-byte IDX file (magic 0x000008DD, DD = number of dimensions, 1 to 4;
// labels are 0x00000801, images 0x00000803) into a u8 tensor of the file's shape.
// gzip or plain: both are read through zlib.
Tensor read_idx(const std::string& path);

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir` (Fashion-MNIST, or
// MNIST, which uses the same names and format; the names without
// .gz are used when only those exist) and checks that they belong together.
Dataset load_fashion_mnist(const std::string& dir = kFashionMnistDir, bool train = true);

}  // namespace nd::data
