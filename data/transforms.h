#pragma once
// Image transforms with torchvision's names and semantics (nd::data::transforms), working
// in uint8 until ToTensor, with per-sample random draws.
// Tests: tests/data/transforms_test.cpp (against torchvision's outputs in
// tests/golden/data_images.safetensors; distributions and determinism of the random ones).
//
// Why a Sample can still be encoded: a crop at the head of a pipeline (RandomResizedCrop,
// CenterCrop) needs only the image's size to choose its box, and then decodes only that box
// (decode_image with a region), which for a 224 crop of a 500 px photo is most of the cost
// saved. A transform that needs every pixel decodes the whole image first.
//
// Why randomness comes in as an argument: a transform is immutable after construction and
// draws from the Generator it is handed. A DataLoader hands sample i of epoch e the stream
// sample_generator(seed, e, i), so augmentations are the same whichever worker thread runs
// them and in whatever order (PyTorch's depend on each worker's seed). Transforms are
// therefore safe to call from several threads at once.
#include <concepts>
#include <cstdint>
#include <memory>
#include <utility>
#include <variant>
#include <vector>

#include "data/image.h"
#include "data/resize.h"
#include "engine/factories.h"
#include "engine/tensor.h"

namespace nd::data {

// The random stream of sample `index` in `epoch`: a function of (seed, epoch, index) alone.
Generator sample_generator(uint64_t seed, int64_t epoch, int64_t index);
// One draw from `gen`, advancing it: uniform in [lo, hi); an integer uniform in [lo, hi).
double uniform(Generator& gen, double lo = 0, double hi = 1);
int64_t randint(Generator& gen, int64_t lo, int64_t hi);

namespace transforms {

// One sample's image on its way through transforms: still encoded, decoded (HWC uint8 RGB),
// or a tensor (after ToTensor: [3, H, W] f32).
using Sample = std::variant<EncodedImage, Image, Tensor>;

// The decoded image of `sample` (decoding an encoded one whole); an nd::Error naming `who`
// for a tensor.
Image& image_of(Sample& sample, const char* who);
// The sample as a tensor: an image becomes [3, H, W] u8 (torchvision's pil_to_tensor, not
// ToTensor's f32), a tensor stays as it is.
Tensor as_tensor(Sample sample);

class Transform {
 public:
  virtual ~Transform() = default;
  // Transforms `sample` in place, drawing from `gen` if random. Const and thread-safe.
  virtual void operator()(Sample& sample, Generator& gen) const = 0;
};

// A copyable handle to any transform (empty: the identity), so that pipelines are built
// from values: Compose({Resize(64), CenterCrop(64), ToTensor()}).
class AnyTransform {
 public:
  AnyTransform() = default;
  template <class T>
    requires std::derived_from<T, Transform>
  AnyTransform(T transform) : impl_(std::make_shared<const T>(std::move(transform))) {}
  void operator()(Sample& sample, Generator& gen) const {
    if (impl_) (*impl_)(sample, gen);
  }
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<const Transform> impl_;
};

// The transforms in order.
class Compose : public Transform {
 public:
  explicit Compose(std::vector<AnyTransform> transforms) : transforms_(std::move(transforms)) {}
  void operator()(Sample& sample, Generator& gen) const override;

 private:
  std::vector<AnyTransform> transforms_;
};

// size {s}: the smaller edge becomes s, the other int(s * long / short) (torchvision's
// rounding down); size {h, w}: exactly h x w. Antialiased (data/resize.h).
// fast(true): a still-encoded JPEG at least 2, 4 or 8 times the output size in both
// dimensions is decoded at that reduced scale (decode_image_reduced, the largest that
// fits) and resized from there: several times faster, not torchvision's pixels
// (docs/data.md gives the PSNR against the exact mode).
class Resize : public Transform {
 public:
  explicit Resize(std::vector<int64_t> size, InterpolationMode interpolation = InterpolationMode::kBilinear);
  Resize& fast(bool on) {
    fast_ = on;
    return *this;
  }
  void operator()(Sample& sample, Generator& gen) const override;
  // The output size (height, width) for an input of height x width.
  std::pair<int64_t, int64_t> output_size(int64_t height, int64_t width) const;
  // fast(true)'s reduced scale for an image of height x width: 1, 2, 4 or 8.
  int reduction(int64_t height, int64_t width) const;

 private:
  std::vector<int64_t> size_;
  InterpolationMode interpolation_;
  bool fast_ = false;
};

// The central size {s} (square) or {h, w} box, its offsets rounded as Python's round() does
// (half to even); an image smaller than the box is first padded with zeros on all sides, as
// torchvision does. Decodes only the box of an encoded image.
class CenterCrop : public Transform {
 public:
  explicit CenterCrop(std::vector<int64_t> size);
  void operator()(Sample& sample, Generator& gen) const override;

 private:
  int64_t height_, width_;
};

// torchvision's RandomResizedCrop: a box of area fraction in `scale` and aspect ratio
// (width / height) log-uniform in `ratio`, 10 tries, then the central box of the image
// clamped to `ratio` (get_params), cropped and resized to size {s} or {h, w}. Decodes only
// the box of an encoded image.
class RandomResizedCrop : public Transform {
 public:
  explicit RandomResizedCrop(std::vector<int64_t> size, std::pair<double, double> scale = {0.08, 1.0},
                             std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0},
                             InterpolationMode interpolation = InterpolationMode::kBilinear);
  void operator()(Sample& sample, Generator& gen) const override;
  // The box (top, left, height, width) drawn for an image of height x width.
  Box get_params(int64_t height, int64_t width, Generator& gen) const;

 private:
  int64_t height_, width_;
  std::pair<double, double> scale_, ratio_;
  InterpolationMode interpolation_;
};

// Mirrors left-right with probability p (one draw per sample).
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  void operator()(Sample& sample, Generator& gen) const override;

 private:
  double p_;
};

// An image to a [3, H, W] f32 tensor in [0, 1] (v / 255).
class ToTensor : public Transform {
 public:
  void operator()(Sample& sample, Generator& gen) const override;
};

// (x - mean[c]) / std[c] per channel of a [C, H, W] f32 tensor (after ToTensor).
class Normalize : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  void operator()(Sample& sample, Generator& gen) const override;

 private:
  std::vector<double> mean_, std_;
};

}  // namespace transforms
}  // namespace nd::data
