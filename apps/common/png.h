#pragma once
// Images for the apps: an 8-bit gray or RGB canvas, a PNG writer (nd::encode_png's
// bytes, written atomically), sample grids from image tensors, and a loss-curve plot
// with a 3x5 pixel font for its labels. Tests: tests/apps/apps_test.cpp decodes what it
// writes; tests/apps/plot_test.cpp checks the plot's ticks, smoothing and panels.
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

// images [N, 1, H, W] or [N, 3, H, W] (any device) with values in [-1, 1] -> a gray or RGB
// grid of `cols` columns, `pad` pixels between tiles (background mid-gray).
Image image_grid(const nd::Tensor& images, int cols, int pad = 2);

// One named line of (step, value) points.
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};
// A width x height RGB plot with one panel per series (each model's loss has its own
// scale): the raw points as a light line, TensorBoard's smoothing (`smooth`, weight 0.6)
// over them in full color, round tick values on both axes (`nice_ticks`), the series'
// name as the panel's title and "step" under the x axis, in a small pixel font. One or
// two series stack; three or four make a 2 x 2 grid; more, 2 columns.
Image plot_series(const std::vector<Series>& series, int width = 800, int height = 480);

// Several named lines in one panel, as they are (no smoothing): `title` on top, a legend
// (each line's color and name) under it, `x_label` under the x axis. log2_x: x > 0 on a log2
// axis, ticks at powers of two. Colors as plot_series'.
Image plot_lines(const std::string& title, const std::vector<Series>& lines, const std::string& x_label, bool log2_x,
                 int width = 800, int height = 480);

// Tick values for an axis spanning [lo, hi]: multiples of a step of 1, 2 or 5 x 10^k,
// from the largest multiple <= lo to the smallest >= hi: at most max_ticks intervals
// (max_ticks >= 2), the axis widened to round ends. lo == hi widens to a unit around it,
// non-finite bounds (no point) give [0, 1].
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 5);

// TensorBoard's scalar smoothing: an exponential moving average of weight w in [0, 1),
// debiased (divided by 1 - w^n after n values) so the first points are not pulled to
// zero; non-finite values are skipped (their output is the last smoothed value, or NaN).
std::vector<double> smooth(const std::vector<double>& values, double weight = 0.6);

}  // namespace app
