// Transforms (data/transforms.h) against torchvision's tensor path on the same uint8
// image (tests/golden/make_data_images_golden.py): deterministic ones within 1 level of
// 255; random ones for their distribution, their determinism per (seed, epoch, index), and
// encoded (region-decoded) input giving what decoded input gives.
#include <cmath>
#include <map>
#include <set>

#include "data_test_util.h"

using namespace nd;
using namespace nd::data::transforms;
using nd::testing::image_goldens;

namespace {

// A golden [H, W, 3] u8 tensor as an Image.
data::Image image_from(const Tensor& hwc) {
  data::Image image(hwc.size(0), hwc.size(1));
  const uint8_t* p = hwc.contiguous().data_ptr<uint8_t>();
  image.pixels.assign(p, p + image.pixels.size());
  return image;
}

data::Image astronaut() { return image_from(image_goldens().at("decode.j420.jpg")); }

// Largest |ours - golden| over a [3, H, W] u8 golden, and how many values differ at all.
struct Diff {
  int max = 0;
  int64_t differing = 0, total = 0;
};
Diff compare_chw(const data::Image& ours, const Tensor& golden) {
  REQUIRE(golden.dim() == 3);
  REQUIRE(ours.height == golden.size(1));
  REQUIRE(ours.width == golden.size(2));
  const uint8_t* g = golden.contiguous().data_ptr<uint8_t>();
  const int64_t plane = ours.height * ours.width;
  Diff d;
  for (int64_t p = 0; p < plane; ++p)
    for (int c = 0; c < 3; ++c) {
      const int diff = std::abs(int{ours.pixels[p * 3 + c]} - int{g[c * plane + p]});
      d.max = std::max(d.max, diff);
      d.differing += diff != 0;
      ++d.total;
    }
  return d;
}

data::Image run(const AnyTransform& t, Sample sample, Generator gen = {}) {
  t(sample, gen);
  return std::get<data::Image>(sample);
}

}  // namespace

TEST_CASE("Resize matches torchvision's antialiased tensor path within 1 level (bilinear, bicubic, down and up)") {
  const std::map<std::string, Resize> cases = {
      {"32_bilinear", Resize({32})},
      {"32_bicubic", Resize({32}, data::InterpolationMode::kBicubic)},
      {"20x50_bilinear", Resize({20, 50})},
      {"20x50_bicubic", Resize({20, 50}, data::InterpolationMode::kBicubic)},
      {"70_bilinear", Resize({70})},
      {"70_bicubic", Resize({70}, data::InterpolationMode::kBicubic)},
      {"61x30_bicubic", Resize({61, 30}, data::InterpolationMode::kBicubic)},  // one pass only
  };
  for (const auto& [name, resize] : cases) {
    CAPTURE(name);
    const Diff d = compare_chw(run(resize, astronaut()), image_goldens().at("resize." + name));
    CHECK(d.max <= 1);
    CHECK(d.differing * 100 <= d.total);  // off by one only at float ties: under 1% of values
  }
  CHECK(Resize({32}).output_size(61, 77) == std::pair<int64_t, int64_t>{32, 40});  // int(32 * 77 / 61)
  CHECK(Resize({32}).output_size(77, 61) == std::pair<int64_t, int64_t>{40, 32});
  CHECK(Resize({5}).output_size(3, 10) == std::pair<int64_t, int64_t>{5, 16});  // 16.67 rounds down
}

TEST_CASE("CenterCrop equals torchvision's (offsets rounded half to even, zero padding when larger)") {
  for (const auto& [h, w] : std::vector<std::pair<int, int>>{{31, 31}, {30, 40}, {61, 77}, {70, 80}}) {
    CAPTURE(h);
    CAPTURE(w);
    const auto& golden = image_goldens().at("center_crop." + std::to_string(h) + "x" + std::to_string(w));
    CHECK(compare_chw(run(CenterCrop({h, w}), astronaut()), golden).max == 0);
    // Encoded input: only the box is decoded, same pixels (the golden decode is PIL's = ours).
    if (h <= 61 && w <= 77)
      CHECK(compare_chw(run(CenterCrop({h, w}), data::read_image(golden_image("j420.jpg"))), golden).max == 0);
  }
}

TEST_CASE("RandomResizedCrop's crop + resize equals torchvision's resized_crop within 1 level") {
  for (const auto& [top, left, h, w, out] :
       std::vector<std::tuple<int, int, int, int, int>>{{3, 5, 40, 50, 24}, {0, 0, 61, 77, 32}, {10, 7, 13, 9, 20}}) {
    const std::string name = std::to_string(top) + "_" + std::to_string(left) + "_" + std::to_string(h) + "_" +
                             std::to_string(w) + "_" + std::to_string(out);
    CAPTURE(name);
    // The crop of the golden image, resized as RandomResizedCrop resizes its box.
    const data::Image full = astronaut();
    data::Image cropped(h, w);
    for (int y = 0; y < h; ++y)
      std::copy_n(full.row(top + y) + left * 3, w * 3, cropped.row(y));
    const data::Image ours = data::resize(cropped, out, out, data::InterpolationMode::kBilinear);
    CHECK(compare_chw(ours, image_goldens().at("resized_crop." + name)).max <= 1);
  }
}

TEST_CASE("RandomHorizontalFlip(1) mirrors exactly, ToTensor + Normalize match torchvision's f32") {
  CHECK(compare_chw(run(RandomHorizontalFlip(1.0), astronaut()), image_goldens().at("hflip")).max == 0);
  CHECK(run(RandomHorizontalFlip(0.0), astronaut()).pixels == astronaut().pixels);

  Sample s = image_from(image_goldens().at("decode.j444.jpg"));
  Generator gen;
  Compose({ToTensor(), Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})})(s, gen);
  nd::testing::check_close(std::get<Tensor>(s), image_goldens().at("normalize"), 1e-6, 1e-6, "normalize");
}

TEST_CASE("RandomResizedCrop draws boxes with torchvision's distribution, inside the image, ratio in range") {
  const RandomResizedCrop rrc({224});
  const int64_t H = 375, W = 500, n = 20000;
  double log_ratio_sum = 0;
  int64_t small = 0, large = 0;
  for (int64_t i = 0; i < n; ++i) {
    Generator gen = data::sample_generator(1, 0, i);
    const data::Box b = rrc.get_params(H, W, gen);
    REQUIRE((b.top >= 0 && b.left >= 0 && b.top + b.height <= H && b.left + b.width <= W && b.height > 0 && b.width > 0));
    const double ratio = static_cast<double>(b.width) / b.height, area = static_cast<double>(b.width * b.height) / (H * W);
    CHECK(ratio >= 3.0 / 4.0 * 0.97);  // rounding of w and h
    CHECK(ratio <= 4.0 / 3.0 * 1.03);
    CHECK(area >= 0.08 * 0.95);
    log_ratio_sum += std::log(ratio);
    small += area < 0.54;  // the middle of [0.08, 1]
    large += area >= 0.54;
  }
  // torchvision's get_params on the same 375 x 500 image, 200,000 draws: mean log(w / h)
  // 0.0308 (wide boxes fit a landscape image more often), sd 0.164; P(area < 0.54) 0.672.
  // Bounds: 4 standard errors of our 20,000 draws.
  CHECK(std::abs(log_ratio_sum / n - 0.0308) < 4 * 0.164 / std::sqrt(n));
  CHECK(std::abs(static_cast<double>(small) / n - 0.672) < 4 * std::sqrt(0.672 * 0.328 / n));
  CHECK(small + large == n);
}

TEST_CASE("RandomResizedCrop falls back to torchvision's central box when 10 draws do not fit") {
  // Ratios of 10 to 20 never fit a square image: w = width, h = round(w / 10).
  const RandomResizedCrop rrc({8}, {0.9, 1.0}, {10.0, 20.0});
  Generator gen = data::sample_generator(3, 0, 0);
  const data::Box b = rrc.get_params(100, 100, gen);
  CHECK(b.top == 45);
  CHECK(b.left == 0);
  CHECK(b.height == 10);
  CHECK(b.width == 100);
  CHECK(gen.offset == 20);  // 10 tries of 2 draws each
  const RandomResizedCrop tall({8}, {0.9, 1.0}, {0.05, 0.1});  // in_ratio 2 > 0.1: h = height, w = round(h * 0.1)
  gen = data::sample_generator(3, 0, 0);
  const data::Box t = tall.get_params(50, 100, gen);
  CHECK(t.height == 50);
  CHECK(t.width == 5);
  CHECK(t.left == 47);
}

TEST_CASE("random transforms are a function of (seed, epoch, index), and encoded input decodes only the box") {
  const Compose pipeline({RandomResizedCrop({24}), RandomHorizontalFlip()});
  const data::EncodedImage encoded = data::read_image(golden_image("jregion.jpg"));
  const data::Image decoded = data::decode_image(encoded.bytes, encoded.path);
  std::set<std::string> distinct;  // (not vector<uint8_t>: GCC 12's -Wstringop-overread on its <=>)
  int flips = 0;
  for (int64_t i = 0; i < 40; ++i) {
    const data::Image a = run(pipeline, encoded, data::sample_generator(5, 2, i));
    CHECK(run(pipeline, encoded, data::sample_generator(5, 2, i)).pixels == a.pixels);  // same draws
    CHECK(run(pipeline, decoded, data::sample_generator(5, 2, i)).pixels == a.pixels);  // region == full decode
    distinct.insert(std::string(a.pixels.begin(), a.pixels.end()));
  }
  CHECK(distinct.size() == 40);
  for (int64_t i = 0; i < 2000; ++i) {
    Generator gen = data::sample_generator(9, 0, i);
    flips += data::uniform(gen) < 0.5;
  }
  CHECK(std::abs(flips - 1000) < 4 * 23);  // binomial(2000, 1/2): sd 22.4
  CHECK(data::sample_generator(5, 2, 7).seed != data::sample_generator(5, 3, 7).seed);
  CHECK(data::sample_generator(5, 2, 7).seed != data::sample_generator(5, 2, 8).seed);
}

TEST_CASE("transforms in the wrong order or with bad arguments are errors naming the transform") {
  Generator gen;
  Sample s = astronaut();
  ToTensor()(s, gen);
  CHECK(error_message([&] { Resize({8})(s, gen); }) == "Resize expects an image, got a tensor: put it before ToTensor");
  CHECK(error_message([&] { CenterCrop({8})(s, gen); }) ==
        "CenterCrop expects an image, got a tensor: put it before ToTensor");
  Sample image = astronaut();
  CHECK(error_message([&] { Normalize({0.5}, {0.5})(image, gen); }) ==
        "Normalize expects a [1, H, W] f32 tensor (put it after ToTensor), got an image");
  CHECK(error_message([&] { Resize({8, 8, 8}); }) ==
        "Resize: expected a size {s} or {height, width} of positive integers, got {8, 8, 8}");
  CHECK(error_message([&] { CenterCrop({0}); }) ==
        "CenterCrop: expected a size {s} or {height, width} of positive integers, got {0}");
  CHECK(error_message([&] { RandomResizedCrop({8}, {0.5, 0.1}); }) ==
        "RandomResizedCrop: expected 0 < scale.min <= scale.max and 0 < ratio.min <= ratio.max, got scale (0.5, "
        "0.1) and ratio (0.75, 1.33333)");
  CHECK(error_message([&] { Normalize({0.5, 0.5}, {0.5}); }) ==
        "Normalize: expected mean and std of the same length, got 2 and 1");
}

namespace {
// PSNR in dB between two images of one size (infinite when equal).
double psnr(const data::Image& a, const data::Image& b) {
  REQUIRE(a.height == b.height);
  REQUIRE(a.width == b.width);
  double se = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) se += std::pow(static_cast<double>(a.pixels[i]) - static_cast<double>(b.pixels[i]), 2);
  return se == 0 ? INFINITY : 10 * std::log10(255.0 * 255.0 * static_cast<double>(a.pixels.size()) / se);
}
}  // namespace

TEST_CASE("Resize fast(true): JPEGs decoded at 1/2, 1/4 or 1/8 scale when the output is that much smaller") {
  CHECK(Resize({16}).reduction(61, 77) == 2);  // 16 x 20 out: 30 x 38 fits, 15 x 19 does not
  CHECK(Resize({8}).reduction(61, 77) == 4);
  CHECK(Resize({64}).reduction(300, 400) == 4);
  CHECK(Resize({4}).reduction(300, 400) == 8);
  CHECK(Resize({40}).reduction(61, 77) == 1);
  const data::EncodedImage jpeg = data::read_image(golden_image("j420.jpg"));
  const data::Image half = data::decode_image_reduced(jpeg.bytes, jpeg.path, 2);
  CHECK((half.height == 31 && half.width == 39));  // ceil(61 / 2) x ceil(77 / 2)
  CHECK(error_message([&] { data::decode_image_reduced(jpeg.bytes, jpeg.path, 3); }) ==
        "decode_image_reduced: the scale must be 1, 2, 4 or 8, got 1/3");
  // Same size as the exact mode and near it: these small, detailed crops give 20.7 to 43.3 dB
  // (the bench folder's photographs, docs/data.md: higher); equal where no reduced scale
  // fits, and for a PNG.
  for (const char* name : {"j420.jpg", "j422.jpg", "j444.jpg", "jprogressive.jpg"}) {
    for (int64_t size : {16, 8}) {
      CAPTURE(name);
      CAPTURE(size);
      const data::EncodedImage e = data::read_image(golden_image(name));
      const data::Image exact = run(Resize({size}), e), fast = run(Resize({size}).fast(true), e);
      CHECK(psnr(exact, fast) > 20);
      CHECK(psnr(exact, fast) < 45);  // not the exact decode
    }
  }
  const data::EncodedImage e = data::read_image(golden_image("j420.jpg"));
  CHECK(psnr(run(Resize({40}), e), run(Resize({40}).fast(true), e)) == INFINITY);
  const data::EncodedImage png = data::read_image(golden_image("rgb8.png"));
  CHECK(psnr(run(Resize({8}), png), run(Resize({8}).fast(true), png)) == INFINITY);
}
