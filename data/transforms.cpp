#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/error.h"
#include "engine/factories.h"

namespace nd::data {

Generator sample_generator(uint64_t seed, int64_t epoch, int64_t index) {
  // Two rounds of the engine's counter hash: distinct (epoch, index) pairs get unrelated keys.
  return Generator{random_bits(random_bits(seed, static_cast<uint64_t>(epoch)), static_cast<uint64_t>(index)), 0};
}

double uniform(Generator& gen, double lo, double hi) {
  return lo + (hi - lo) * random_uniform(gen.seed, gen.offset++);
}

int64_t randint(Generator& gen, int64_t lo, int64_t hi) {
  ND_CHECK(hi > lo, "randint: the range [", lo, ", ", hi, ") is empty");
  // Modulo bias below 2^-40 for ranges under 2^24 (image sizes).
  return lo + static_cast<int64_t>(random_bits(gen.seed, gen.offset++) % static_cast<uint64_t>(hi - lo));
}

namespace transforms {

namespace {

// Python's round(): half to even (std::nearbyint under the default rounding mode).
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

// {s} -> (s, s); {h, w} -> (h, w); anything else an error naming `who`.
std::pair<int64_t, int64_t> square_or_pair(const std::vector<int64_t>& size, const char* who) {
  if ((size.size() == 1 || size.size() == 2) && std::all_of(size.begin(), size.end(), [](int64_t s) { return s >= 1; }))
    return {size[0], size.back()};
  std::string got = "{";
  for (size_t i = 0; i < size.size(); ++i) got += (i ? ", " : "") + std::to_string(size[i]);
  throw Error(nd::detail::str_cat(who, ": expected a size {s} or {height, width} of positive integers, got ", got, "}"));
}

[[noreturn]] void got_a_tensor(const char* who) {
  throw Error(nd::detail::str_cat(who, " expects an image, got a tensor: put it before ToTensor"));
}

std::pair<int64_t, int64_t> size_of(const Sample& sample, const char* who) {
  if (const auto* e = std::get_if<EncodedImage>(&sample)) return {e->info.height, e->info.width};
  if (const auto* i = std::get_if<Image>(&sample)) return {i->height, i->width};
  got_a_tensor(who);
}

Image crop_image(const Image& image, const Box& box) {
  Image out(box.height, box.width);
  for (int64_t y = 0; y < box.height; ++y)
    std::memcpy(out.row(y), image.row(box.top + y) + box.left * 3, static_cast<size_t>(box.width) * 3);
  return out;
}

// `box` (inside the image) of the sample: an encoded image decodes only the box.
void crop(Sample& sample, const Box& box, const char* who) {
  if (const auto* e = std::get_if<EncodedImage>(&sample))
    sample = decode_image(e->bytes, e->path, box);
  else
    sample = crop_image(image_of(sample, who), box);
}

}  // namespace

Image& image_of(Sample& sample, const char* who) {
  if (auto* e = std::get_if<EncodedImage>(&sample)) sample = decode_image(e->bytes, e->path);
  if (auto* i = std::get_if<Image>(&sample)) return *i;
  got_a_tensor(who);
}

Tensor as_tensor(Sample sample) {
  if (auto* t = std::get_if<Tensor>(&sample)) return *t;
  const Image& image = image_of(sample, "as_tensor");
  Tensor out = empty({3, image.height, image.width}, TensorOptions(kUInt8));
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t plane = image.height * image.width;
  for (int64_t p = 0; p < plane; ++p)
    for (int c = 0; c < 3; ++c) dst[c * plane + p] = image.pixels[p * 3 + c];
  return out;
}

void Compose::operator()(Sample& sample, Generator& gen) const {
  for (const AnyTransform& t : transforms_) t(sample, gen);
}

Resize::Resize(std::vector<int64_t> size, InterpolationMode interpolation)
    : size_(std::move(size)), interpolation_(interpolation) {
  square_or_pair(size_, "Resize");
}

std::pair<int64_t, int64_t> Resize::output_size(int64_t height, int64_t width) const {
  if (size_.size() == 2) return {size_[0], size_[1]};
  // torchvision's _compute_resized_output_size: int(s * long / short), Python's true division.
  const int64_t short_side = std::min(height, width), long_side = std::max(height, width);
  const auto long_out = static_cast<int64_t>(static_cast<double>(size_[0] * long_side) / static_cast<double>(short_side));
  return width <= height ? std::pair{long_out, size_[0]} : std::pair{size_[0], long_out};
}

int Resize::reduction(int64_t height, int64_t width) const {
  const auto [h, w] = output_size(height, width);
  int d = 1;
  while (d < 8 && height / (2 * d) >= h && width / (2 * d) >= w) d *= 2;
  return d;
}

void Resize::operator()(Sample& sample, Generator&) const {
  std::pair<int64_t, int64_t> size;
  if (const auto* e = std::get_if<EncodedImage>(&sample)) {
    size = output_size(e->info.height, e->info.width);  // from the full size, also when decoded reduced
    const int d = fast_ && e->info.format == ImageFormat::kJpeg ? reduction(e->info.height, e->info.width) : 1;
    if (d > 1) sample = decode_image_reduced(e->bytes, e->path, d);
  } else {
    const Image& image = image_of(sample, "Resize");
    size = output_size(image.height, image.width);
  }
  Image& image = image_of(sample, "Resize");
  image = resize(image, size.first, size.second, interpolation_);
}

CenterCrop::CenterCrop(std::vector<int64_t> size) {
  std::tie(height_, width_) = square_or_pair(size, "CenterCrop");
}

void CenterCrop::operator()(Sample& sample, Generator&) const {
  auto [h, w] = size_of(sample, "CenterCrop");
  if (height_ > h || width_ > w) {  // torchvision pads first, (top, left) getting the smaller half
    const Image& image = image_of(sample, "CenterCrop");
    const int64_t ph = std::max(height_, h), pw = std::max(width_, w);
    const int64_t top = (ph - h) / 2, left = (pw - w) / 2;
    Image padded(ph, pw);
    for (int64_t y = 0; y < h; ++y) std::memcpy(padded.row(top + y) + left * 3, image.row(y), static_cast<size_t>(w) * 3);
    sample = std::move(padded);
    h = ph;
    w = pw;
  }
  crop(sample, {round_half_even((h - height_) / 2.0), round_half_even((w - width_) / 2.0), height_, width_},
       "CenterCrop");
}

RandomResizedCrop::RandomResizedCrop(std::vector<int64_t> size, std::pair<double, double> scale,
                                     std::pair<double, double> ratio, InterpolationMode interpolation)
    : scale_(scale), ratio_(ratio), interpolation_(interpolation) {
  std::tie(height_, width_) = square_or_pair(size, "RandomResizedCrop");
  ND_CHECK(scale.first > 0 && scale.first <= scale.second && ratio.first > 0 && ratio.first <= ratio.second,
           "RandomResizedCrop: expected 0 < scale.min <= scale.max and 0 < ratio.min <= ratio.max, got scale (",
           scale.first, ", ", scale.second, ") and ratio (", ratio.first, ", ", ratio.second, ")");
}

Box RandomResizedCrop::get_params(int64_t height, int64_t width, Generator& gen) const {
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(ratio_.first), log_hi = std::log(ratio_.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(gen, scale_.first, scale_.second);
    const double aspect_ratio = std::exp(uniform(gen, log_lo, log_hi));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect_ratio));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t top = randint(gen, 0, height - h + 1);
      return {top, randint(gen, 0, width - w + 1), h, w};
    }
  }
  // The central box, clamped to the ratio range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio_.first)
    h = round_half_even(static_cast<double>(w) / ratio_.first);
  else if (in_ratio > ratio_.second)
    w = round_half_even(static_cast<double>(h) * ratio_.second);
  return {(height - h) / 2, (width - w) / 2, h, w};
}

void RandomResizedCrop::operator()(Sample& sample, Generator& gen) const {
  const auto [h, w] = size_of(sample, "RandomResizedCrop");
  crop(sample, get_params(h, w, gen), "RandomResizedCrop");
  Image& image = std::get<Image>(sample);
  image = resize(image, height_, width_, interpolation_);
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  ND_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

void RandomHorizontalFlip::operator()(Sample& sample, Generator& gen) const {
  if (uniform(gen) >= p_) return;
  Image& image = image_of(sample, "RandomHorizontalFlip");
  for (int64_t y = 0; y < image.height; ++y) {
    uint8_t* row = image.row(y);
    for (int64_t l = 0, r = image.width - 1; l < r; ++l, --r) std::swap_ranges(row + l * 3, row + l * 3 + 3, row + r * 3);
  }
}

void ToTensor::operator()(Sample& sample, Generator&) const {
  const Image& image = image_of(sample, "ToTensor");
  Tensor out = empty({3, image.height, image.width});
  float* dst = out.data_ptr<float>();
  const int64_t plane = image.height * image.width;
  for (int64_t p = 0; p < plane; ++p)
    for (int c = 0; c < 3; ++c) dst[c * plane + p] = static_cast<float>(image.pixels[p * 3 + c]) / 255.0f;
  sample = out;
}

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  ND_CHECK(mean_.size() == std_.size() && !mean_.empty(), "Normalize: expected mean and std of the same length, got ",
           mean_.size(), " and ", std_.size());
  for (double s : std_) ND_CHECK(s != 0, "Normalize: std must not be 0");
}

void Normalize::operator()(Sample& sample, Generator&) const {
  Tensor* t = std::get_if<Tensor>(&sample);
  ND_CHECK(t && t->dtype() == kFloat32 && t->dim() == 3 && t->size(0) == static_cast<int64_t>(mean_.size()),
           "Normalize expects a [", mean_.size(), ", H, W] f32 tensor (put it after ToTensor), got ",
           t ? shape_str(t->sizes()) : std::string("an image"));
  // Plain loops, no tensor op: a DataLoader's worker threads run this (an engine op would
  // start an OpenMP team from each of them).
  const Tensor in = t->contiguous();
  Tensor out = empty(in.sizes());
  const float* x = in.data_ptr<float>();
  float* v = out.data_ptr<float>();
  const int64_t plane = out.size(1) * out.size(2);
  for (size_t c = 0; c < mean_.size(); ++c) {
    // torchvision's float32 sub_ then div_.
    const float m = static_cast<float>(mean_[c]), s = static_cast<float>(std_[c]);
    for (int64_t p = 0; p < plane; ++p) v[c * plane + p] = (x[c * plane + p] - m) / s;
  }
  sample = out;
}

}  // namespace transforms
}  // namespace nd::data
