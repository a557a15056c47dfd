#include "data/image.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/decoders.h"
#include "engine/error.h"

namespace nd::data {

using nd::detail::str_cat;

namespace detail {

std::string size_problem(int64_t height, int64_t width) {
  if (height <= 0 || width <= 0) return str_cat("its header gives an empty image (", width, " x ", height, " pixels)");
  if (height * width > kMaxImagePixels)
    return str_cat("its header claims ", width, " x ", height, " pixels, more than PIL's decompression-bomb limit of ",
                   kMaxImagePixels);
  return "";
}

Error file_error(const std::string& path, const std::string& what) {
  return Error(str_cat("decode_image: '", path, "': ", what));
}

}  // namespace detail

namespace {

// The format from the file's first bytes: JPEG's SOI marker FF D8 FF, PNG's 8-byte signature.
bool is_jpeg(const std::vector<uint8_t>& b) { return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF; }
bool is_png(const std::vector<uint8_t>& b) {
  static constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), kSignature, 8) == 0;
}

[[noreturn]] void not_an_image(const std::vector<uint8_t>& bytes, const std::string& path) {
  std::string start;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, "%02X", bytes[i]);
    start += (i ? " " : "") + std::string(hex);
  }
  throw detail::file_error(path, bytes.empty() ? "the file is empty; expected a JPEG or PNG image"
                                               : str_cat("not a JPEG or PNG image (it starts with bytes ", start,
                                                         "; a JPEG starts with FF D8 FF, a PNG with 89 50 4E 47)"));
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw detail::file_error(path, "it is a directory, not a file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw detail::file_error(path, str_cat("cannot open it: ", errno ? std::strerror(errno) : "unknown error"));
  // One read of the file's size (a regular file); byte by byte where it has none (a pipe).
  std::vector<uint8_t> bytes;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size >= 0 && in.seekg(0)) {
    bytes.resize(static_cast<size_t>(size));
    in.read(reinterpret_cast<char*>(bytes.data()), size);
    bytes.resize(static_cast<size_t>(in.gcount()));
  } else {
    in.clear();
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (in.bad()) throw detail::file_error(path, "reading it failed");
  return bytes;
}

EncodedImage read_image(const std::string& path) {
  EncodedImage image{path, read_file(path), {}};
  image.info = image_info(image.bytes, path);
  return image;
}

ImageInfo image_info(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (is_jpeg(bytes)) return detail::jpeg_info(bytes, path);
  if (is_png(bytes)) return detail::png_info(bytes, path);
  not_an_image(bytes, path);
}

namespace {

Image decode(const std::vector<uint8_t>& bytes, const std::string& path, const Box* region) {
  if (is_jpeg(bytes)) return detail::decode_jpeg(bytes, path, region);
  if (is_png(bytes)) return detail::decode_png(bytes, path, region);
  not_an_image(bytes, path);
}

}  // namespace

Image decode_image(const std::vector<uint8_t>& bytes, const std::string& path) { return decode(bytes, path, nullptr); }

Image decode_image_reduced(const std::vector<uint8_t>& bytes, const std::string& path, int scale_denom) {
  ND_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
           "decode_image_reduced: the scale must be 1, 2, 4 or 8, got 1/", scale_denom);
  if (is_jpeg(bytes)) return detail::decode_jpeg_reduced(bytes, path, scale_denom);
  return decode(bytes, path, nullptr);
}

Image decode_image(const std::vector<uint8_t>& bytes, const std::string& path, const Box& region) {
  const ImageInfo info = image_info(bytes, path);
  ND_CHECK(region.top >= 0 && region.left >= 0 && region.height >= 1 && region.width >= 1 &&
               region.top + region.height <= info.height && region.left + region.width <= info.width,
           "decode_image: '", path, "': the region (top ", region.top, ", left ", region.left, ", height ",
           region.height, ", width ", region.width, ") does not lie inside the ", info.width, " x ", info.height,
           " image");
  return decode(bytes, path, &region);
}

}  // namespace nd::data
