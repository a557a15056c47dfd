#pragma once
// Images for the apps: an 8-bit gray or RGB canvas, a PNG writer (nd::encode_png's
// bytes, written atomically), sample grids from image tensors, and a loss-curve plot
// with a 3x5 pixel font for its labels. Tests: tests/apps/apps_test.cpp decodes what it writes.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nanoddp.h>

namespace app {

struct Image {
  Image(int width_, int height_, int channels_, uint8_t fill = 0)
      : width(width_), height(height_), channels(channels_),
        pixels(static_cast<size_t>(width_) * height_ * channels_, fill) {}
  int width, height, channels;  // channels: 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;  // row-major, channels interleaved
  uint8_t* at(int x, int y) { return &pixels[(static_cast<size_t>(y) * width + x) * channels]; }
};

// Writes `image` as a PNG, atomically (a temp file renamed over `path`). Throws nd::Error.
void write_png(const std::string& path, const Image& image);
// The image as a u8 [C, H, W] tensor (encode_png's and SummaryWriter::add_image's layout).
nd::Tensor image_tensor(const Image& image);

// images [N, 1, H, W] (any device) with values in [-1, 1] -> a gray grid of `cols`
// columns, `pad` pixels between tiles (background mid-gray).
Image image_grid(const nd::Tensor& images, int cols, int pad = 2);

// One named line of (step, value) points.
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};
// A width x height RGB line plot of every series on shared axes, with the y range,
// the x range and a legend written in a small pixel font.
Image plot_series(const std::vector<Series>& series, int width = 800, int height = 480);

}  // namespace app
