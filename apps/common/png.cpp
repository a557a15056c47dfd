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
    {':', {0, 2, 0, 2, 0}}, {'+', {0, 2, 7, 2, 0}}, {'|', {2, 2, 2, 2, 2}}, {',', {0, 0, 0, 2, 4}},
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
  ND_CHECK(images.dim() == 4 && (images.size(1) == 1 || images.size(1) == 3),
           "image_grid: expected [N, 1, H, W] or [N, 3, H, W] images, got ", nd::shape_str(images.sizes()));
  const nd::Tensor data = images.detach().cpu().to(nd::kFloat32).contiguous();
  const int n = static_cast<int>(data.size(0)), c = static_cast<int>(data.size(1)), h = static_cast<int>(data.size(2)),
            w = static_cast<int>(data.size(3));
  const int rows = (n + cols - 1) / cols;
  Image grid(cols * w + (cols + 1) * pad, rows * h + (rows + 1) * pad, c, 128);
  const float* p = data.data_ptr<float>();
  for (int i = 0; i < n; ++i) {
    const int x0 = pad + (i % cols) * (w + pad), y0 = pad + (i / cols) * (h + pad);
    for (int k = 0; k < c; ++k)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          const float v = std::clamp(p[((static_cast<size_t>(i) * c + k) * h + y) * w + x], -1.0f, 1.0f);
          grid.at(x0 + x, y0 + y)[k] = static_cast<uint8_t>(std::lround((v + 1) * 127.5f));
        }
  }
  return grid;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  ND_CHECK(max_ticks >= 2, "nice_ticks: max_ticks must be at least 2, got ", max_ticks);
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;  // an empty plot
  if (!(lo < hi)) lo -= 0.5, hi = lo + 1;
  // The smallest step of 1, 2 or 5 x 10^k whose multiples cover [lo, hi] in at most
  // max_ticks intervals (raw <= base * 10, so 20 always fits for max_ticks >= 2).
  const double raw = (hi - lo) / max_ticks, base = std::pow(10.0, std::floor(std::log10(raw)));
  double step = base;
  for (const double m : {1.0, 2.0, 5.0, 10.0, 20.0}) {
    step = base * m;
    if (std::ceil(hi / step - 1e-9) - std::floor(lo / step + 1e-9) <= max_ticks) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  for (double k = first; k <= last; ++k) ticks.push_back(k * step == 0 ? 0.0 : k * step);  // no "-0"
  return ticks;
}

std::vector<double> smooth(const std::vector<double>& values, double weight) {
  ND_CHECK(weight >= 0 && weight < 1, "smooth: weight must be in [0, 1), got ", weight);
  std::vector<double> out;
  double ema = 0, smoothed = NAN;
  int n = 0;
  for (const double v : values) {
    if (std::isfinite(v)) {
      ema = ema * weight + (1 - weight) * v;
      ++n;
      smoothed = ema / (1 - std::pow(weight, n));
    }
    out.push_back(smoothed);
  }
  return out;
}

namespace {

const uint8_t kColors[][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40},
                              {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127}};

// A plot area [left, right] x [top, bottom] in pixels showing [xa, xb] x [ya, yb].
struct Axes {
  int left, right, top, bottom;
  double xa, xb, ya, yb;
  int px(double x) const { return left + static_cast<int>(std::lround((x - xa) / (xb - xa) * (right - left))); }
  int py(double y) const { return bottom - static_cast<int>(std::lround((y - ya) / (yb - ya) * (bottom - top))); }
};

// Grid lines and labels at the y ticks, tick marks and labels (x_name(x)) at the x ticks,
// x_label centred under them, the two axis lines.
void draw_axes(Image& img, const Axes& a, const std::vector<double>& x_ticks, const std::vector<double>& y_ticks,
               const std::string& x_label, std::string (*x_name)(double)) {
  const uint8_t black[3] = {0, 0, 0}, grid_gray[3] = {225, 225, 225};
  for (const double y : y_ticks) {
    draw_line(img, a.left, a.py(y), a.right, a.py(y), grid_gray);
    const std::string label = short_number(y);
    draw_text(img, a.left - 6 - text_width(label), a.py(y) - 5, label, black);
  }
  for (const double x : x_ticks) {
    draw_line(img, a.px(x), a.bottom, a.px(x), a.bottom + 4, black);
    const std::string label = x_name(x);
    draw_text(img, a.px(x) - text_width(label) / 2, a.bottom + 8, label, black);
  }
  draw_text(img, (a.left + a.right - text_width(x_label)) / 2, a.bottom + 24, x_label, black);
  draw_line(img, a.left, a.top, a.left, a.bottom, black);
  draw_line(img, a.left, a.bottom, a.right, a.bottom, black);
}

// One panel of plot_series in the rectangle [x0, x1) x [y0, y1) of img.
void plot_panel(Image& img, int x0, int y0, int x1, int y1, const Series& series, const uint8_t* color) {
  const uint8_t black[3] = {0, 0, 0};
  // The raw line in the color mixed 35/65 with white: the smoothed one reads on top of it.
  uint8_t light[3];
  for (int c = 0; c < 3; ++c) light[c] = static_cast<uint8_t>(color[c] * 0.35 + 255 * 0.65);
  std::vector<double> xs, ys;
  for (const auto& [x, y] : series.points) xs.push_back(x), ys.push_back(y);
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  for (size_t i = 0; i < xs.size(); ++i) {
    x_min = std::min(x_min, xs[i]), x_max = std::max(x_max, xs[i]);
    if (std::isfinite(ys[i])) y_min = std::min(y_min, ys[i]), y_max = std::max(y_max, ys[i]);
  }
  const std::vector<double> x_ticks = nice_ticks(x_min, x_max, 6), y_ticks = nice_ticks(y_min, y_max, 4);
  const Axes axes{x0 + 64, x1 - 16, y0 + 26, y1 - 42, x_ticks.front(), x_ticks.back(), y_ticks.front(), y_ticks.back()};
  draw_text(img, axes.left, y0 + 8, series.name, black);
  draw_axes(img, axes, x_ticks, y_ticks, "step", short_number);
  auto px = [&](double x) { return axes.px(x); };
  auto py = [&](double y) { return axes.py(y); };

  auto draw_series = [&](const std::vector<double>& values, const uint8_t* rgb) {
    for (size_t i = 1; i < values.size(); ++i)
      if (std::isfinite(values[i - 1]) && std::isfinite(values[i]))
        draw_line(img, px(xs[i - 1]), py(values[i - 1]), px(xs[i]), py(values[i]), rgb);
    if (values.size() == 1 && std::isfinite(values[0]))
      draw_line(img, px(xs[0]), py(values[0]), px(xs[0]) + 1, py(values[0]), rgb);
  };
  draw_series(ys, light);
  draw_series(smooth(ys), color);
}

}  // namespace

Image plot_series(const std::vector<Series>& series, int width, int height) {
  Image img(width, height, 3, 255);
  const int n = static_cast<int>(series.size());
  if (n == 0) return img;
  const int cols = n <= 2 ? 1 : 2, rows = (n + cols - 1) / cols;
  for (int s = 0; s < n; ++s) {
    const int c = s % cols, r = s / cols;
    plot_panel(img, c * width / cols, r * height / rows, (c + 1) * width / cols, (r + 1) * height / rows, series[s],
               kColors[s % 8]);
  }
  return img;
}

Image plot_lines(const std::string& title, const std::vector<Series>& lines, const std::string& x_label, bool log2_x,
                 int width, int height) {
  const uint8_t black[3] = {0, 0, 0};
  Image img(width, height, 3, 255);
  auto x_of = [&](double x) { return log2_x ? std::log2(x) : x; };
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  for (const Series& s : lines)
    for (const auto& [x, y] : s.points) {
      ND_CHECK(!log2_x || x > 0, "plot_lines: a log2 x axis needs x > 0, found ", x, " in '", s.name, "'");
      x_min = std::min(x_min, x_of(x)), x_max = std::max(x_max, x_of(x));
      if (std::isfinite(y)) y_min = std::min(y_min, y), y_max = std::max(y_max, y);
    }
  // The legend under the title: a short line in each color and the line's name, wrapped.
  const int entry_height = 16;
  int lx = 64, ly = 30;
  std::vector<std::pair<int, int>> legend;
  for (const Series& s : lines) {
    const int w = 24 + text_width(s.name) + 16;
    if (lx + w > width - 16 && lx > 64) lx = 64, ly += entry_height;
    legend.emplace_back(lx, ly);
    lx += w;
  }
  const std::vector<double> x_ticks = log2_x ? nice_ticks(std::floor(x_min), std::ceil(x_max), 12)
                                             : nice_ticks(x_min, x_max, 6);
  const std::vector<double> y_ticks = nice_ticks(y_min, y_max, 5);
  const Axes axes{64, width - 16, ly + entry_height + 8, height - 42, x_ticks.front(), x_ticks.back(), y_ticks.front(),
                  y_ticks.back()};
  draw_text(img, axes.left, 8, title, black);
  draw_axes(img, axes, x_ticks, y_ticks, x_label,
            log2_x ? +[](double x) { return short_number(std::pow(2.0, x)); } : short_number);
  for (size_t i = 0; i < lines.size(); ++i) {
    const uint8_t* color = kColors[i % 8];
    const auto [ex, ey] = legend[i];
    for (int t = 0; t < 2; ++t) draw_line(img, ex, ey + 4 + t, ex + 16, ey + 4 + t, color);
    draw_text(img, ex + 22, ey, lines[i].name, black);
    const auto& pts = lines[i].points;
    for (size_t k = 1; k < pts.size(); ++k)
      if (std::isfinite(pts[k - 1].second) && std::isfinite(pts[k].second))
        for (int t = 0; t < 2; ++t)  // two pixels thick
          draw_line(img, axes.px(x_of(pts[k - 1].first)), axes.py(pts[k - 1].second) + t, axes.px(x_of(pts[k].first)),
                    axes.py(pts[k].second) + t, color);
  }
  return img;
}

}  // namespace app
