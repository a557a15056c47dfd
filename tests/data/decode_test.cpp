// Decoders (data/image.h): every committed JPEG and PNG against PIL's convert("RGB")
// pixels (tests/golden/make_data_images_golden.py), bit for bit; region decodes against
// the same region of the full decode; headers; and every kind of bad file.
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "data_test_util.h"
#include "kernels/common/counter_rng.h"

using namespace nd;

namespace {

const std::vector<std::string> kJpegs = {"j420.jpg",  "j422.jpg",  "j444.jpg", "jprogressive.jpg",
                                         "jgrey.jpg", "jcmyk.jpg", "jregion.jpg"};
const std::vector<std::string> kPngs = {"rgb8.png",  "rgba8.png",  "grey8.png",         "greyalpha8.png",
                                        "grey1.png", "grey2.png",  "grey4.png",         "palette4_trns.png",
                                        "rgb16.png", "grey16.png", "interlaced.png"};

data::Image decode_file(const std::string& name) {
  const std::string path = golden_image(name);
  return data::decode_image(data::read_file(path), path);
}

// How many bytes differ between `image` and a golden [H, W, 3] u8 tensor (shapes must match).
int64_t differing(const data::Image& image, const Tensor& golden) {
  REQUIRE(golden.dim() == 3);
  REQUIRE(image.height == golden.size(0));
  REQUIRE(image.width == golden.size(1));
  const uint8_t* g = golden.contiguous().data_ptr<uint8_t>();
  int64_t n = 0;
  for (size_t i = 0; i < image.pixels.size(); ++i) n += image.pixels[i] != g[i];
  return n;
}

data::Image crop(const data::Image& image, const data::Box& b) {
  data::Image out(b.height, b.width);
  for (int64_t y = 0; y < b.height; ++y)
    std::memcpy(out.row(y), image.row(b.top + y) + b.left * 3, static_cast<size_t>(b.width) * 3);
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Offset of the first `marker` (FF xx) segment in a JPEG, or of a PNG chunk's type.
size_t find(const Bytes& b, const Bytes& what) {
  const auto it = std::search(b.begin(), b.end(), what.begin(), what.end());
  REQUIRE(it != b.end());
  return static_cast<size_t>(it - b.begin());
}

}  // namespace

TEST_CASE("every committed JPEG and PNG decodes to PIL's convert(\"RGB\") pixels, bit for bit") {
  const TensorDict& goldens = nd::testing::image_goldens();
  int files = 0;
  for (const auto& list : {kJpegs, kPngs})
    for (const std::string& name : list) {
      if (name == "jregion.jpg") continue;  // no golden (size); its regions are checked below
      CAPTURE(name);
      REQUIRE(goldens.count("decode." + name));
      CHECK(differing(decode_file(name), goldens.at("decode." + name)) == 0);
      ++files;
    }
  CHECK(files == 17);
}

TEST_CASE("image_info reads format and size from the header") {
  const auto info = [](const std::string& name) {
    return data::image_info(data::read_file(golden_image(name)), name);
  };
  CHECK(info("j420.jpg").format == data::ImageFormat::kJpeg);
  CHECK(info("j420.jpg").height == 61);
  CHECK(info("j420.jpg").width == 77);
  CHECK(info("jregion.jpg").height == 141);
  CHECK(info("jregion.jpg").width == 203);
  CHECK(info("interlaced.png").format == data::ImageFormat::kPng);
  CHECK(info("interlaced.png").height == 17);
  CHECK(info("interlaced.png").width == 23);
}

TEST_CASE("a region decode equals that region of the full decode (MCU-aligned and not)") {
  Generator gen{37, 0};
  for (const auto& list : {kJpegs, kPngs})
    for (const std::string& name : list) {
      CAPTURE(name);
      const std::string path = golden_image(name);
      const Bytes bytes = data::read_file(path);
      const data::Image full = data::decode_image(bytes, path);
      std::vector<data::Box> boxes = {{0, 0, full.height, full.width},
                                      {0, 0, 1, 1},
                                      {full.height - 1, full.width - 1, 1, 1},
                                      {2, 2, full.height / 2, full.width / 2},
                                      {1, full.width - 3, full.height - 2, 2},
                                      {full.height / 2, 0, full.height - full.height / 2, full.width}};
      // Boxes starting on iMCU boundaries (8 and 16 pixels) and ending just before them.
      for (int64_t at = 8; at + 1 < std::min(full.height, full.width); at += 8) {
        boxes.push_back({at, at, full.height - at, full.width - at});
        boxes.push_back({0, 0, at - 1, at - 1});
      }
      for (int i = 0; i < 60; ++i) {
        const auto draw = [&](int64_t n) {
          return static_cast<int64_t>(kernels::counter_hash(gen.seed, gen.offset++) % static_cast<uint64_t>(n));
        };
        const int64_t h = 1 + draw(full.height), w = 1 + draw(full.width);
        boxes.push_back({draw(full.height - h + 1), draw(full.width - w + 1), h, w});
      }
      for (const data::Box& b : boxes) {
        CAPTURE(b.top);
        CAPTURE(b.left);
        CAPTURE(b.height);
        CAPTURE(b.width);
        const data::Image region = data::decode_image(bytes, path, b);
        CHECK(region.pixels == crop(full, b).pixels);
      }
    }
}

TEST_CASE("a region outside the image is an error naming the file and the size") {
  const std::string path = golden_image("j420.jpg");
  const Bytes bytes = data::read_file(path);
  CHECK(error_message([&] { data::decode_image(bytes, path, {50, 0, 12, 10}); }) ==
        "decode_image: '" + path +
            "': the region (top 50, left 0, height 12, width 10) does not lie inside the 77 x 61 image");
  CHECK(contains(error_message([&] { data::decode_image(bytes, path, {0, 0, 0, 10}); }), "does not lie inside"));
}

TEST_CASE("a cut-off or corrupt JPEG is an error naming the file and the problem") {
  TempDir dir;
  const Bytes good = data::read_file(golden_image("j420.jpg"));
  // Cut off in the middle of the compressed data: libjpeg only warns and fills with grey.
  const std::string cut = dir.file("cut.jpg");
  write_bytes(cut, Bytes(good.begin(), good.begin() + static_cast<long>(good.size() * 2 / 3)));
  CHECK(error_message([&] { data::decode_image(data::read_file(cut), cut); }) ==
        "decode_image: '" + cut + "': not a valid JPEG: Premature end of JPEG file");
  // A restart marker in the middle of a scan that has none.
  Bytes marker = good;
  const size_t mid = (find(good, {0xFF, 0xDA}) + good.size()) / 2;
  marker[mid] = 0xFF;
  marker[mid + 1] = 0xD3;
  const std::string corrupt = dir.file("marker.jpg");
  write_bytes(corrupt, marker);
  const std::string msg = error_message([&] { data::decode_image(data::read_file(corrupt), corrupt); });
  CHECK(contains(msg, "decode_image: '" + corrupt + "': not a valid JPEG: Corrupt JPEG data"));
  // Only the header: the size is known, the pixels are not.
  const std::string header = dir.file("header.jpg");
  const size_t sos = find(good, {0xFF, 0xDA});
  write_bytes(header, Bytes(good.begin(), good.begin() + static_cast<long>(sos + 2 + (good[sos + 2] << 8) + good[sos + 3])));
  CHECK(data::image_info(data::read_file(header), header).width == 77);
  CHECK(contains(error_message([&] { data::decode_image(data::read_file(header), header); }), "not a valid JPEG:"));
  // A JPEG signature and nothing else.
  CHECK(error_message([&] { data::decode_image(Bytes{0xFF, 0xD8, 0xFF}, "three.jpg"); }) ==
        "decode_image: 'three.jpg': not a valid JPEG: Premature end of JPEG file");
}

TEST_CASE("a PNG with a bad CRC, cut-off or corrupt image data, or no IEND is an error") {
  const Bytes good = data::read_file(golden_image("rgb8.png"));
  const size_t idat = find(good, {'I', 'D', 'A', 'T'});
  const uint32_t length = (uint32_t{good[idat - 4]} << 24) | (good[idat - 3] << 16) | (good[idat - 2] << 8) | good[idat - 1];
  const auto message = [](const Bytes& b) { return error_message([&] { data::decode_image(b, "x.png"); }); };

  Bytes bad_crc = good;
  bad_crc[idat + 4 + length] ^= 0x01;  // the CRC follows the type and the data
  CHECK(message(bad_crc) == "decode_image: 'x.png': not a valid PNG: IDAT: CRC error");

  // Corrupt deflate data under a correct CRC.
  Bytes corrupt = good;
  for (size_t i = idat + 4 + length / 3; i < idat + 4 + length / 3 + 16; ++i) corrupt[i] ^= 0x5A;
  const uLong crc = crc32(0, corrupt.data() + idat, length + 4);
  for (int k = 0; k < 4; ++k) corrupt[idat + 4 + length + k] = static_cast<uint8_t>(crc >> (24 - 8 * k));
  CHECK(contains(message(corrupt), "decode_image: 'x.png': not a valid PNG: IDAT: "));

  CHECK(message(Bytes(good.begin(), good.begin() + static_cast<long>(idat + length / 2))) ==
        "decode_image: 'x.png': not a valid PNG: the file ends early (it is truncated)");
  CHECK(message(Bytes(good.begin(), good.end() - 12)) ==  // the IEND chunk cut off
        "decode_image: 'x.png': not a valid PNG: the file ends early (it is truncated)");
  Bytes bad_header_crc = good;
  bad_header_crc[29] ^= 0x01;  // IHDR's CRC: 8 signature + 4 length + 4 type + 13 data
  CHECK(message(bad_header_crc) == "decode_image: 'x.png': not a valid PNG: IHDR: CRC error");
}

TEST_CASE("a file that is not an image, empty, missing or a directory is an error naming it") {
  TempDir dir;
  const std::string text = dir.file("notes.jpg");
  write_bytes(text, Bytes{'h', 'e', 'l', 'l', 'o'});
  CHECK(error_message([&] { data::decode_image(data::read_file(text), text); }) ==
        "decode_image: '" + text +
            "': not a JPEG or PNG image (it starts with bytes 68 65 6C 6C; a JPEG starts with FF D8 FF, a PNG with "
            "89 50 4E 47)");
  CHECK(error_message([&] { data::image_info(Bytes{}, "empty.png"); }) ==
        "decode_image: 'empty.png': the file is empty; expected a JPEG or PNG image");
  const std::string missing = dir.file("missing.png");
  CHECK(error_message([&] { data::read_file(missing); }) ==
        "decode_image: '" + missing + "': cannot open it: No such file or directory");
  CHECK(error_message([&] { data::read_file(dir.path.string()); }) ==
        "decode_image: '" + dir.path.string() + "': it is a directory, not a file");
}

TEST_CASE("every cut-off prefix of a JPEG and a PNG is an nd::Error, and damaged bytes never crash") {
  for (const std::string name : {"j420.jpg", "jprogressive.jpg", "interlaced.png", "palette4_trns.png"}) {
    CAPTURE(name);
    const Bytes good = data::read_file(golden_image(name));
    int64_t errors = 0;
    for (size_t n = 0; n < good.size(); ++n) {
      try {
        data::decode_image(Bytes(good.begin(), good.begin() + static_cast<long>(n)), name);
      } catch (const Error& e) {
        errors += std::string(e.what()).starts_with("decode_image: '" + name + "': ");
      }
    }
    CHECK(errors == static_cast<int64_t>(good.size()));
    // 300 single damaged bytes: each file decodes (to some pixels) or is an nd::Error.
    for (uint64_t k = 0; k < 300; ++k) {
      Bytes bad = good;
      bad[kernels::counter_hash(k, 0) % bad.size()] ^= static_cast<uint8_t>(1 + kernels::counter_hash(k, 1) % 255);
      try {
        data::decode_image(bad, name);
      } catch (const Error&) {
      }
    }
  }
}

TEST_CASE("a header claiming more pixels than PIL's decompression-bomb limit is refused before allocating") {
  Bytes png = data::read_file(golden_image("grey1.png"));
  // IHDR width and height 40000 x 40000 (1.6e9 pixels), with the CRC recomputed.
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 4; ++i) png[16 + 4 * k + i] = static_cast<uint8_t>(40000u >> (24 - 8 * i));
  const uLong crc = crc32(0, png.data() + 12, 17);
  for (int i = 0; i < 4; ++i) png[29 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
  CHECK(data::image_info(png, "big.png").width == 40000);
  CHECK(error_message([&] { data::decode_image(png, "big.png"); }) ==
        "decode_image: 'big.png': its header claims 40000 x 40000 pixels, more than PIL's decompression-bomb "
        "limit of 178956970");
}
