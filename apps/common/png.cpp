#include "common/png.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

namespace app {

namespace {

// 3x5 glyphs, one row per entry, bit 4 = left column.
struct Glyph {
  char c;
  uint8_t rows[5];
};
constexpr Glyph kFont[] = {
    {'0', {7, 5, 5, 5, 7}}, {'1', {2, 6, 2, 2, 7}}, {'2', {7, 1, 7, 4, 7}}, {'3', {7, 1, 7, 1, 7}},
    {'4', {5, 5, 7, 1, 1}}, {'5', {7, 4, 7, 1, 7}}, {'6', {7, 4, 7, 5, 7}}, {'7', {7, 1, 1, 1, 1}},
    {'8', {7, 5, 7, 5, 7}}, {'9', {7, 5, 7, 1, 7}}, {'a', {2, 5, 7, 5, 5}}, {'b', {6, 5, 6, 5, 6}},
    {'c', {3, 4, 4, 4, 3}}, {'d', {6, 5, 5, 5, 6}}, {'e', {7, 4, 6, 4, 7}}, {'f', {7, 4, 6, 4, 4}},
    {'g', {3, 4, 5, 5, 3}}, {'h', {5, 5, 7, 5, 5}}, {'i', {7, 2, 2, 2, 7}}, {'j', {1, 1, 1, 5, 2}},
    {'k', {5, 5, 6, 5, 5}}, {'l', {4, 4, 4, 4, 7}}, {'m', {5, 7, 7, 5, 5}}, {'n', {6, 5, 5, 5, 5}},
    {'o', {2, 5, 5, 5, 2}}, {'p', {6, 5, 6, 4, 4}}, {'q', {2, 5, 5, 6, 3}}, {'r', {6, 5, 6, 5, 5}},
    {'s', {3, 4, 2, 1, 6}}, {'t', {7, 2, 2, 2, 2}}, {'u', {5, 5, 5, 5, 7}}, {'v', {5, 5, 5, 5, 2}},
    {'w', {5, 5, 7, 7, 5}}, {'x', {5, 5, 2, 5, 5}}, {'y', {5, 5, 2, 2, 2}}, {'z', {7, 1, 2, 4, 7}},
    {'.', {0, 0, 0, 0, 2}}, {'-', {0, 0, 7, 0, 0}}, {'_', {0, 0, 0, 0, 7}}, {'/', {1, 1, 2, 4, 4}},
    {':', {0, 2, 0, 2, 0}}, {'+', {0, 2, 7, 2, 0}}, {'|', {2, 2, 2, 2, 2}},
};
constexpr int kScale = 2;  // each font pixel is kScale x kScale

void set_pixel(Image& img, int x, int y, const uint8_t* rgb) {
  if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
  std::copy_n(rgb, img.channels, img.at(x, y));
}

// Left edge at x, top at y; returns the x after the text.
int draw_text(Image& img, int x, int y, const std::string& text, const uint8_t* rgb) {
  for (char c : text) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const Glyph& g : kFont) {
      if (g.c != lower) continue;
      for (int r = 0; r < 5; ++r)
        for (int col = 0; col < 3; ++col)
          if (g.rows[r] & (4 >> col))
            for (int dy = 0; dy < kScale; ++dy)
              for (int dx = 0; dx < kScale; ++dx) set_pixel(img, x + col * kScale + dx, y + r * kScale + dy, rgb);
    }
    x += 4 * kScale;
  }
  return x;
}

int text_width(const std::string& text) { return static_cast<int>(text.size()) * 4 * kScale; }

// Bresenham.
void draw_line(Image& img, int x0, int y0, int x1, int y1, const uint8_t* rgb) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    set_pixel(img, x0, y0, rgb);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

void write_png(const std::string& path, const Image& image) {
  const std::string png = nd::encode_png(image_tensor(image));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(png.data(), static_cast<std::streamsize>(png.size()));
    ND_CHECK(out.good(), "cannot write ", tmp);
  }
  ND_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path);
}

nd::Tensor image_tensor(const Image& image) {
  nd::Tensor hwc = nd::empty({image.height, image.width, image.channels}, nd::TensorOptions(nd::kUInt8));
  std::copy(image.pixels.begin(), image.pixels.end(), hwc.data_ptr<uint8_t>());
  return hwc.permute({2, 0, 1});
}

Image image_grid(const nd::Tensor& images, int cols, int pad) {
  ND_CHECK(images.dim() == 4 && images.size(1) == 1, "image_grid: expected [N, 1, H, W] images, got a ",
           images.dim(), "-d tensor");
  const nd::Tensor data = images.detach().cpu().to(nd::kFloat32).contiguous();
  const int n = static_cast<int>(data.size(0)), h = static_cast<int>(data.size(2)),
            w = static_cast<int>(data.size(3));
  const int rows = (n + cols - 1) / cols;
  Image grid(cols * w + (cols + 1) * pad, rows * h + (rows + 1) * pad, 1, 128);
  const float* p = data.data_ptr<float>();
  for (int i = 0; i < n; ++i) {
    const int x0 = pad + (i % cols) * (w + pad), y0 = pad + (i / cols) * (h + pad);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const float v = std::clamp(p[(static_cast<size_t>(i) * h + y) * w + x], -1.0f, 1.0f);
        *grid.at(x0 + x, y0 + y) = static_cast<uint8_t>(std::lround((v + 1) * 127.5f));
      }
  }
  return grid;
}

Image plot_series(const std::vector<Series>& series, int width, int height) {
  static const uint8_t kColors[][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40},
                                       {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127}};
  const uint8_t black[3] = {0, 0, 0}, grid_gray[3] = {225, 225, 225};
  Image img(width, height, 3, 255);
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x_min = std::min(x_min, x), x_max = std::max(x_max, x);
      y_min = std::min(y_min, y), y_max = std::max(y_max, y);
    }
  if (!(x_min <= x_max)) x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  if (x_max == x_min) x_max = x_min + 1;
  if (y_max == y_min) y_max = y_min + 1;
  const int left = 70, right = width - 20, top = 20, bottom = height - 40;
  auto px = [&](double x) { return left + static_cast<int>(std::lround((x - x_min) / (x_max - x_min) * (right - left))); };
  auto py = [&](double y) { return bottom - static_cast<int>(std::lround((y - y_min) / (y_max - y_min) * (bottom - top))); };

  for (int k = 0; k <= 4; ++k) {  // horizontal grid lines with their values
    const double y = y_min + (y_max - y_min) * k / 4;
    draw_line(img, left, py(y), right, py(y), grid_gray);
    const std::string label = short_number(y);
    draw_text(img, left - 6 - text_width(label), py(y) - 5, label, black);
  }
  draw_line(img, left, top, left, bottom, black);
  draw_line(img, left, bottom, right, bottom, black);
  draw_text(img, left, bottom + 8, short_number(x_min), black);
  const std::string x_label = "step " + short_number(x_max);
  draw_text(img, right - text_width(x_label), bottom + 8, x_label, black);

  for (size_t s = 0; s < series.size(); ++s) {
    const uint8_t* color = kColors[s % 8];
    const auto& pts = series[s].points;
    for (size_t i = 1; i < pts.size(); ++i)
      if (std::isfinite(pts[i - 1].second) && std::isfinite(pts[i].second))
        draw_line(img, px(pts[i - 1].first), py(pts[i - 1].second), px(pts[i].first), py(pts[i].second), color);
    if (pts.size() == 1) draw_line(img, px(pts[0].first), py(pts[0].second), px(pts[0].first) + 1, py(pts[0].second), color);
    // Legend, top right: a colored bar and the name.
    const int ly = top + 6 + static_cast<int>(s) * 16, lx = right - 16 - text_width(series[s].name) - 24;
    for (int t = 0; t < 3; ++t) draw_line(img, lx, ly + 3 + t, lx + 16, ly + 3 + t, color);
    draw_text(img, lx + 22, ly, series[s].name, black);
  }
  return img;
}

}  // namespace app
