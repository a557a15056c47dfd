#pragma once
// The two decoders behind data/image.h, one per format; image.cpp picks one by the file's
// signature. Internal to data/.
#include <cstdint>
#include <string>
#include <vector>

#include "data/image.h"
#include "engine/error.h"

namespace nd::data::detail {

// PIL's decompression-bomb limit (2 * Image.MAX_IMAGE_PIXELS): a header claiming more
// pixels is refused before anything is allocated for it.
inline constexpr int64_t kMaxImagePixels = 2 * (1024LL * 1024 * 1024 / 4 / 3);

ImageInfo jpeg_info(const std::vector<uint8_t>& bytes, const std::string& path);
ImageInfo png_info(const std::vector<uint8_t>& bytes, const std::string& path);

// The image, or only `region` of it when `region` is not null (inside the image).
Image decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& path, const Box* region);
Image decode_png(const std::vector<uint8_t>& bytes, const std::string& path, const Box* region);
// The whole JPEG at 1 / scale_denom (1, 2, 4, 8) of its size (libjpeg's scaled IDCT).
Image decode_jpeg_reduced(const std::vector<uint8_t>& bytes, const std::string& path, int scale_denom);

// Why a header's size is refused ("" when it is fine): both decoders ask before allocating.
std::string size_problem(int64_t height, int64_t width);

// The nd::Error for a file that cannot be used: "decode_image: '<path>': <what>".
Error file_error(const std::string& path, const std::string& what);

}  // namespace nd::data::detail
