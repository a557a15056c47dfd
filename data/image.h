#pragma once
// Image files to pixels: JPEG (libjpeg-turbo) and PNG (libpng), decoded to what PIL's
// `Image.open(path).convert("RGB")` gives, pixel for pixel (docs/data.md "Decoding").
// Tests: tests/data/decode_test.cpp (against PIL's pixels in tests/golden/data_images.safetensors).
//
// Every function here is thread-safe (no shared state): a DataLoader's workers call them
// at once. A file that cannot be decoded is an nd::Error naming the file and what is
// wrong with it; `path` is only used for those messages.
#include <cstdint>
#include <string>
#include <vector>

namespace nd::data {

// An RGB image in memory: height rows of width pixels of 3 bytes (R, G, B), row-major
// (HWC, PIL's layout).
struct Image {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> pixels;  // height * width * 3
  static constexpr int64_t channels = 3;

  Image() = default;
  Image(int64_t height, int64_t width) : height(height), width(width), pixels(height * width * 3) {}
  uint8_t* row(int64_t y) { return pixels.data() + y * width * 3; }
  const uint8_t* row(int64_t y) const { return pixels.data() + y * width * 3; }
};

// A rectangle of an image, in torchvision's crop(img, top, left, height, width) order.
struct Box {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

enum class ImageFormat { kJpeg, kPng };

// What a file's header says, read without decoding any pixel.
struct ImageInfo {
  ImageFormat format = ImageFormat::kJpeg;
  int64_t height = 0, width = 0;
};

// The whole file at `path` (an nd::Error naming it when it cannot be read).
std::vector<uint8_t> read_file(const std::string& path);

// A file read but not yet decoded: its bytes and what its header says. Transforms decode it
// when they need pixels (a crop first decodes only its region).
struct EncodedImage {
  std::string path;
  std::vector<uint8_t> bytes;
  ImageInfo info;
};
// read_file + image_info.
EncodedImage read_image(const std::string& path);

// The format (from the file's signature, not its name) and the size. An nd::Error when
// the bytes are neither a JPEG nor a PNG, or the header is cut off or invalid.
ImageInfo image_info(const std::vector<uint8_t>& bytes, const std::string& path);

// The image as RGB, PIL's convert("RGB"): no EXIF rotation; alpha (an alpha channel or a
// tRNS chunk) dropped, not composited; greyscale, palette and 1-, 2-, 4-bit images
// expanded; CMYK JPEGs converted as PIL does. 16-bit PNGs become 8 bits as
// round(v * 255 / 65535) (PIL keeps the high byte or clips instead).
// JPEGs decode with the accurate integer DCT and fancy upsampling, PIL's settings.
// A JPEG whose compressed data libjpeg finds cut off or corrupt (it only warns, and would
// fill the rest with grey) is an error, as is a PNG with any bad CRC (PIL skips the image
// data's CRC) or missing image data.
Image decode_image(const std::vector<uint8_t>& bytes, const std::string& path);

// Only `region` of the image: the same pixels as that region of the full decode. For a
// JPEG, rows above the region are skipped and only the iMCU columns it touches are decoded
// (libjpeg-turbo's jpeg_skip_scanlines and jpeg_crop_scanline), and rows below it are not
// read at all (so corruption there goes unnoticed). A PNG is decoded whole and the region
// copied out (its rows are compressed as one stream). The region must lie inside the image.
Image decode_image(const std::vector<uint8_t>& bytes, const std::string& path, const Box& region);

// Fast mode (not PIL's pixels): a JPEG decoded at 1 / scale_denom of its size (2, 4 or 8;
// 1 is the exact decode), ceil(width / d) x ceil(height / d), by libjpeg's scaled inverse
// DCT, which skips most of the work (DALI's and FFCV's trick). A PNG is decoded whole.
Image decode_image_reduced(const std::vector<uint8_t>& bytes, const std::string& path, int scale_denom);

}  // namespace nd::data
