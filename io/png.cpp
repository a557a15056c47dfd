#include "io/png.h"

#include <zlib.h>

#include <vector>

#include "engine/error.h"

namespace nd {

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>(v >> shift);
}

// A chunk: length, type, data, CRC-32 over type and data.
void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.append(type, 4);
  out += data;
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(out.data() + type_at), static_cast<uInt>(4 + data.size()));
  put_u32(out, static_cast<uint32_t>(crc));
}

}  // namespace

std::string encode_png(const Tensor& image) {
  ND_CHECK(image.dtype() == kUInt8, "encode_png: expected a u8 image, got ", dtype_name(image.dtype()));
  ND_CHECK(image.dim() == 3, "encode_png: expected a [C, H, W] image, got a ", image.dim(), "-d tensor");
  const int64_t channels = image.size(0), height = image.size(1), width = image.size(2);
  ND_CHECK(channels == 1 || channels == 3 || channels == 4, "encode_png: expected 1, 3 or 4 channels, got ", channels);
  ND_CHECK(height > 0 && width > 0, "encode_png: empty image [", channels, ", ", height, ", ", width, "]");
  // PNG stores pixels interleaved, rows top to bottom.
  const Tensor hwc = image.detach().cpu().permute({1, 2, 0}).contiguous();
  const auto* pixels = hwc.data_ptr<uint8_t>();
  const size_t row = static_cast<size_t>(width * channels);
  std::vector<uint8_t> raw;
  raw.reserve((row + 1) * static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) {
    raw.push_back(0);  // filter type None
    raw.insert(raw.end(), pixels + y * row, pixels + (y + 1) * row);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packed_size, '\0');
  ND_CHECK(compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size, raw.data(), static_cast<uLong>(raw.size()),
                     6) == Z_OK,
           "encode_png: zlib's compress2 failed");
  packed.resize(packed_size);

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put_u32(ihdr, static_cast<uint32_t>(width));
  put_u32(ihdr, static_cast<uint32_t>(height));
  const char color_type = channels == 1 ? 0 : channels == 3 ? 2 : 6;  // gray, RGB, RGBA
  ihdr += {8, color_type, 0, 0, 0};                                   // depth, type, deflate, filter, no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", packed);
  put_chunk(png, "IEND", {});
  return png;
}

}  // namespace nd
