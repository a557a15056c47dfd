// JPEG decoding through libjpeg-turbo's libjpeg API, set up as PIL sets it up, so that the
// pixels are PIL's: the accurate integer DCT (JDCT_ISLOW) and fancy upsampling (both
// libjpeg's defaults, which PIL keeps), libjpeg's own YCbCr -> RGB and greyscale -> RGB,
// and CMYK as PIL reads it (Adobe's inverted polarity, always) then converts it.
//
// Why the libjpeg API and not TurboJPEG's: region decoding. jpeg_skip_scanlines skips the
// rows above a crop and jpeg_crop_scanline decodes only the iMCU columns it touches; the
// TurboJPEG API has no cropped decode before version 3. Both are exact: the kept pixels equal
// the full decode's (tests/data/decode_test.cpp checks random regions of real photographs).
//
// libjpeg reports errors through a longjmp-ing error_exit. The setjmp lives in run(), a
// function with only trivially destructible locals, so the jump skips no destructor;
// decode_jpeg() turns the result into an nd::Error.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "data/decoders.h"

namespace nd::data::detail {

namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// libjpeg only warns about compressed data that is cut off or corrupt, and decodes grey in
// its place; PIL rejects a cut-off file ("image file is truncated"). Here every warning
// about the compressed data is an error. Warnings about metadata (an unknown JFIF revision
// or Adobe transform, a bad ICC profile) and "extraneous bytes before marker" (padding some
// encoders leave between segments; PIL decodes such files) are ignored, as PIL ignores them.
void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_BOGUS_PROGRESSION:
      on_error(cinfo);
    default:
      cinfo->err->num_warnings++;
  }
}

// PIL's CMYK -> RGB (Convert.c cmyk2rgb) on PIL's CMYK, which is libjpeg's inverted:
// with k = 255 - K, R = k - (C * k) / 255 rounded, C = 255 - libjpeg's value.
uint8_t cmyk_channel(uint8_t raw_c, uint8_t raw_k) {
  const int nk = raw_k, c = 255 - raw_c;
  const int tmp = c * nk + 128;
  return static_cast<uint8_t>(nk - (((tmp >> 8) + tmp) >> 8));
}

struct Job {
  const std::vector<uint8_t>* bytes;
  const Box* region;       // null: the whole image
  bool header_only;        // stop after the header (jpeg_info)
  int scale_denom;         // 1, 2, 4 or 8: libjpeg's scaled IDCT (whole images only)
  ImageInfo info;
  Image* out;
  std::vector<uint8_t>* row;  // one decoded row (3 or 4 bytes a pixel)
  char message[JMSG_LENGTH_MAX + 32];
};

// Decodes into job.out; false (job.message set) on a libjpeg error.
bool run(Job& job) {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  if (setjmp(err.jump)) {
    std::snprintf(job.message, sizeof job.message, "not a valid JPEG: %s", err.message);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, job.bytes->data(), static_cast<unsigned long>(job.bytes->size()));
  jpeg_read_header(&cinfo, TRUE);
  job.info = {ImageFormat::kJpeg, cinfo.image_height, cinfo.image_width};
  if (job.header_only) {
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  {  // scoped: no std::string may be alive when libjpeg longjmps
    const std::string problem = size_problem(cinfo.image_height, cinfo.image_width);
    if (!problem.empty()) {
      std::snprintf(job.message, sizeof job.message, "%s", problem.c_str());
      jpeg_destroy_decompress(&cinfo);
      return false;
    }
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(job.scale_denom);
  jpeg_start_decompress(&cinfo);

  const Box box = job.region ? *job.region : Box{0, 0, cinfo.output_height, cinfo.output_width};
  // Fancy upsampling treats the edges of a jpeg_crop_scanline region as the image's edges:
  // the pixels there would take a replicated chroma sample instead of their neighbour's.
  // The region asked for therefore reaches a margin (one chroma sample's worth, twice) past
  // the box on both sides; jpeg_crop_scanline then moves its left edge down to an iMCU
  // boundary. Every pixel of the box is then exact (decode_test checks).
  const int64_t margin = 2 * cinfo.max_h_samp_factor;
  const int64_t first = std::max<int64_t>(box.left - margin, 0);
  JDIMENSION x0 = static_cast<JDIMENSION>(first);
  JDIMENSION width =
      static_cast<JDIMENSION>(std::min<int64_t>(box.left + box.width + margin, cinfo.output_width) - first);
  if (width != cinfo.output_width) jpeg_crop_scanline(&cinfo, &x0, &width);
  if (box.top > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(box.top));
  const int components = cinfo.output_components;
  job.row->resize(static_cast<size_t>(cinfo.output_width) * components);
  *job.out = Image(box.height, box.width);
  const int64_t skip = box.left - x0;
  // RGB rows that are the box's whole width go straight into the image, several at a time;
  // others through the row buffer (cut to the box, or converted from CMYK).
  const bool direct = !cmyk && skip == 0 && static_cast<int64_t>(cinfo.output_width) == box.width;
  for (int64_t y = 0; y < box.height;) {
    JSAMPROW rows[16];
    const int64_t n = direct ? std::min<int64_t>({box.height - y, 16, cinfo.rec_outbuf_height}) : 1;
    for (int64_t i = 0; i < n; ++i) rows[i] = direct ? job.out->row(y + i) : job.row->data();
    const int64_t got = jpeg_read_scanlines(&cinfo, rows, static_cast<JDIMENSION>(n));
    if (got == 0) {  // a source that suspends: jpeg_mem_src never does
      std::snprintf(job.message, sizeof job.message, "not a valid JPEG: no scanline after row %lld", (long long)y);
      jpeg_destroy_decompress(&cinfo);
      return false;
    }
    if (!direct) {
      const uint8_t* src = job.row->data() + skip * components;
      uint8_t* dst = job.out->row(y);
      if (!cmyk) std::memcpy(dst, src, static_cast<size_t>(box.width) * 3);
      else
        for (int64_t x = 0; x < box.width; ++x, src += 4, dst += 3)
          for (int c = 0; c < 3; ++c) dst[c] = cmyk_channel(src[c], src[3]);
    }
    y += got;
  }
  // A whole decode reads on to the end of the image, so a file cut off after its last
  // row still fails; a region leaves the rest unread.
  if (!job.region) jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

Job run_or_throw(const std::vector<uint8_t>& bytes, const std::string& path, const Box* region, bool header_only,
                 Image* out, int scale_denom = 1) {
  std::vector<uint8_t> row;
  Job job{&bytes, region, header_only, scale_denom, {}, out, &row, {}};
  if (!run(job)) throw file_error(path, job.message);
  return job;
}

}  // namespace

ImageInfo jpeg_info(const std::vector<uint8_t>& bytes, const std::string& path) {
  return run_or_throw(bytes, path, nullptr, true, nullptr).info;
}

Image decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& path, const Box* region) {
  Image out;
  run_or_throw(bytes, path, region, false, &out);
  return out;
}

Image decode_jpeg_reduced(const std::vector<uint8_t>& bytes, const std::string& path, int scale_denom) {
  Image out;
  run_or_throw(bytes, path, nullptr, false, &out, scale_denom);
  return out;
}

}  // namespace nd::data::detail
