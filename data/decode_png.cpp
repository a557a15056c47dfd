// PNG decoding through libpng, to the pixels of PIL's convert("RGB"): libpng expands
// palettes and 1-, 2-, 4-bit greyscale (as PIL does: a 2-bit v becomes v * 85), then this
// file takes the colour channels and drops any alpha (an alpha channel, or a tRNS chunk
// that libpng expanded into one) without compositing. 16-bit samples become 8 bits as
// round(v * 255 / 65535); PIL keeps the high byte of 16-bit colour and clips 16-bit grey.
//
// Stricter than PIL: every chunk's CRC is checked, the image data's included (PIL skips
// that one), and a file must run to its IEND chunk; a bad CRC, cut-off or corrupt image
// data, or a missing IEND is an error.
//
// libpng reports errors through a longjmp; as in decode_jpeg.cpp, the setjmp lives in a
// function whose locals are trivially destructible.
#include <png.h>

#include <cstdio>
#include <cstring>

#include "data/decoders.h"

namespace nd::data::detail {

namespace {

struct Job {
  const std::vector<uint8_t>* bytes;
  size_t pos;                 // read position in bytes
  bool header_only;
  ImageInfo info;
  std::vector<uint8_t>* raw;  // the decoded image as libpng gives it (after expansion)
  int channels, bit_depth;    // of `raw`
  char message[256];
};

[[noreturn]] void on_error(png_structp png, png_const_charp msg) {
  auto* job = static_cast<Job*>(png_get_error_ptr(png));
  std::snprintf(job->message, sizeof job->message, "not a valid PNG: %s", msg);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // ancillary trouble PIL ignores too

void read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* job = static_cast<Job*>(png_get_io_ptr(png));
  if (n > job->bytes->size() - job->pos) png_error(png, "the file ends early (it is truncated)");
  std::memcpy(out, job->bytes->data() + job->pos, n);
  job->pos += n;
}

bool run(Job& job) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) {
    std::snprintf(job.message, sizeof job.message, "libpng could not allocate its state");
    png_destroy_read_struct(&png, nullptr, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &job, read_bytes);
  png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
  png_read_info(png, info);
  const int64_t height = png_get_image_height(png, info), width = png_get_image_width(png, info);
  job.info = {ImageFormat::kPng, height, width};
  if (job.header_only) {
    png_destroy_read_struct(&png, &info, nullptr);
    return true;
  }
  {  // scoped: no std::string may be alive when libpng longjmps
    const std::string problem = size_problem(height, width);
    if (!problem.empty()) {
      std::snprintf(job.message, sizeof job.message, "%s", problem.c_str());
      png_destroy_read_struct(&png, &info, nullptr);
      return false;
    }
  }
  png_set_expand(png);  // palette -> RGB(A), grey below 8 bits -> 8 bits, tRNS -> alpha
  const int passes = png_set_interlace_handling(png);  // 7 for an Adam7-interlaced image
  png_read_update_info(png, info);
  job.channels = png_get_channels(png, info);
  job.bit_depth = png_get_bit_depth(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  job.raw->resize(row_bytes * static_cast<size_t>(height));
  // png_read_image's loop: every pass over every row, each pass adding its pixels.
  for (int pass = 0; pass < passes; ++pass)
    for (int64_t y = 0; y < height; ++y) png_read_row(png, job.raw->data() + y * row_bytes, nullptr);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

Job run_or_throw(const std::vector<uint8_t>& bytes, const std::string& path, bool header_only,
                 std::vector<uint8_t>* raw) {
  Job job{&bytes, 0, header_only, {}, raw, 0, 0, {}};
  if (!run(job)) throw file_error(path, job.message);
  return job;
}

// A 16-bit sample (big-endian in libpng's rows) to 8 bits: round(v * 255 / 65535). v * 255 /
// 65535 is never exactly halfway (65535 is odd and shares no factor 2 with 2 * 255), so
// adding half the divisor and flooring rounds correctly.
uint8_t to_8_bits(const uint8_t* be16) {
  const uint32_t v = (uint32_t{be16[0]} << 8) | be16[1];
  return static_cast<uint8_t>((v * 255 + 32767) / 65535);
}

}  // namespace

ImageInfo png_info(const std::vector<uint8_t>& bytes, const std::string& path) {
  return run_or_throw(bytes, path, true, nullptr).info;
}

Image decode_png(const std::vector<uint8_t>& bytes, const std::string& path, const Box* region) {
  std::vector<uint8_t> raw;
  const Job job = run_or_throw(bytes, path, false, &raw);
  const Box box = region ? *region : Box{0, 0, job.info.height, job.info.width};
  const int sample_bytes = job.bit_depth / 8, pixel_bytes = job.channels * sample_bytes;
  // Colour channels of a pixel: grey (+ alpha) is one sample, repeated; RGB (+ alpha) three.
  const int colours = job.channels >= 3 ? 3 : 1;
  const size_t row_bytes = static_cast<size_t>(job.info.width) * pixel_bytes;
  Image out(box.height, box.width);
  for (int64_t y = 0; y < box.height; ++y) {
    const uint8_t* src = raw.data() + (box.top + y) * row_bytes + box.left * pixel_bytes;
    uint8_t* dst = out.row(y);
    for (int64_t x = 0; x < box.width; ++x, src += pixel_bytes, dst += 3)
      for (int c = 0; c < 3; ++c) {
        const uint8_t* s = src + (colours == 3 ? c : 0) * sample_bytes;
        dst[c] = sample_bytes == 2 ? to_8_bits(s) : *s;
      }
  }
  return out;
}

}  // namespace nd::data::detail
