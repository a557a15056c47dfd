// apps/common's loss-curve plot (app::plot_series, written as loss_curve.png by every app):
// its round tick values, TensorBoard's smoothing (closed-form values below), and the panel
// layout read back from the pixels. apps_test decodes the PNG the apps write.
#include <cmath>

#include "common/png.h"
#include "harness.h"

namespace {

void check_ticks(double lo, double hi, int max_ticks, const std::vector<double>& expected) {
  CAPTURE(lo);
  CAPTURE(hi);
  const std::vector<double> ticks = app::nice_ticks(lo, hi, max_ticks);
  REQUIRE(ticks.size() == expected.size());
  for (size_t i = 0; i < ticks.size(); ++i) CHECK(ticks[i] == doctest::Approx(expected[i]).epsilon(1e-12));
}

// Pixels of exactly `rgb` inside [x0, x1) x [y0, y1).
int count_color(const app::Image& img, int x0, int y0, int x1, int y1, const uint8_t (&rgb)[3]) {
  int n = 0;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      const uint8_t* p = &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3];
      n += p[0] == rgb[0] && p[1] == rgb[1] && p[2] == rgb[2];
    }
  return n;
}

}  // namespace

TEST_CASE("plot: tick values are multiples of 1, 2 or 5 x 10^k that cover the data") {
  check_ticks(0, 1, 5, {0, 0.2, 0.4, 0.6, 0.8, 1});
  check_ticks(0.37, 2.91, 4, {0, 1, 2, 3});  // 0.2 and 0.5 would need more than 4 intervals
  check_ticks(0, 2000, 6, {0, 500, 1000, 1500, 2000});
  check_ticks(-0.3, 0.7, 4, {-0.5, 0, 0.5, 1});
  check_ticks(1, 1, 5, {0.5, 1, 1.5});                // a flat series gets a unit around it
  check_ticks(INFINITY, -INFINITY, 5, {0, 0.2, 0.4, 0.6, 0.8, 1});  // no finite point
  CHECK(nd::testing::error_message([] { app::nice_ticks(0, 1, 1); }).find("at least 2") != std::string::npos);
}

TEST_CASE("plot: smoothing is TensorBoard's debiased exponential moving average") {
  // weight 0.6: ema_n = 0.6 ema_{n-1} + 0.4 v_n, shown as ema_n / (1 - 0.6^n).
  const std::vector<double> s = app::smooth({1, 2, 3});
  REQUIRE(s.size() == 3);
  CHECK(s[0] == doctest::Approx(1.0));
  CHECK(s[1] == doctest::Approx(1.04 / 0.64));
  CHECK(s[2] == doctest::Approx(1.824 / 0.784));
  for (const double v : app::smooth({5, 5, 5, 5}, 0.9)) CHECK(v == doctest::Approx(5.0));
  const std::vector<double> gap = app::smooth({1, NAN, 3});  // a NaN loss keeps the last value
  CHECK(gap[1] == doctest::Approx(1.0));
  CHECK(gap[2] == doctest::Approx(1.44 / 0.64));
  CHECK(std::isnan(app::smooth({NAN, 2})[0]));
  CHECK(app::smooth({1, 2}, 0.0) == std::vector<double>{1, 2});
}

TEST_CASE("plot: one panel per series, each with its smoothed line over the raw one") {
  std::vector<app::Series> series = {{"loss_d", {}}, {"loss_g", {}}, {"loss_mae", {}}};
  for (int step = 0; step <= 200; step += 10) {
    series[0].points.emplace_back(step, 1.4 + 0.3 * std::sin(step * 0.2));
    series[1].points.emplace_back(step, 5.0 + 2 * std::cos(step * 0.1));  // another scale
    series[2].points.emplace_back(step, 0.9 - 0.002 * step);
  }
  const app::Image img = app::plot_series(series, 800, 480);
  CHECK(img.width == 800);
  CHECK(img.height == 480);
  // Three series: a 2 x 2 grid, panels in reading order, the fourth one empty (white).
  const uint8_t colors[3][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}};
  const int panel[4][2] = {{0, 0}, {400, 0}, {0, 240}, {400, 240}};
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    uint8_t light[3];
    for (int c = 0; c < 3; ++c) light[c] = static_cast<uint8_t>(colors[s][c] * 0.35 + 255 * 0.65);
    const int x0 = panel[s][0], y0 = panel[s][1];
    CHECK(count_color(img, x0, y0, x0 + 400, y0 + 240, colors[s]) > 100);  // the smoothed line
    CHECK(count_color(img, x0, y0, x0 + 400, y0 + 240, light) > 50);       // the raw line
    for (int other = 0; other < 3; ++other)  // no other series' line in this panel
      if (other != s) CHECK(count_color(img, x0, y0, x0 + 400, y0 + 240, colors[other]) == 0);
  }
  const uint8_t white[3] = {255, 255, 255};
  CHECK(count_color(img, 400, 240, 800, 480, white) == 400 * 240);
  // One or two series stack on the full width.
  const app::Image two = app::plot_series({series[0], series[1]}, 800, 480);
  CHECK(count_color(two, 0, 0, 800, 240, colors[0]) > 100);
  CHECK(count_color(two, 0, 240, 800, 480, colors[1]) > 100);
  CHECK(count_color(two, 0, 240, 800, 480, colors[0]) == 0);
}

TEST_CASE("plot: several lines in one panel on a log2 x axis, with a legend") {
  // x = 1, 2, 4, ..., 1024: log2 0..10 over pixels 64..784 (72 per power of two). y ticks 0..1:
  // the legend's row at 30, the plot area from 54 to 438 (384 pixels for 1).
  std::vector<app::Series> lines = {{"flat", {}}, {"falling", {}}};
  for (int k = 0; k <= 10; ++k) {
    lines[0].points.emplace_back(std::pow(2.0, k), 1.0);
    lines[1].points.emplace_back(std::pow(2.0, k), 1.0 - 0.09 * k);
  }
  const app::Image img = app::plot_lines("efficiency", lines, "gpus", true, 800, 480);
  const uint8_t blue[3] = {31, 119, 180}, orange[3] = {255, 127, 14};
  auto is = [&](int x, int y, const uint8_t (&rgb)[3]) {
    const uint8_t* p = &img.pixels[(static_cast<size_t>(y) * img.width + x) * 3];
    return p[0] == rgb[0] && p[1] == rgb[1] && p[2] == rgb[2];
  };
  CHECK(is(64 + 5 * 72, 54, blue));     // y = 1 at x = 32
  CHECK(is(64 + 5 * 72, 227, orange));  // y = 0.55: 438 - 0.55 * 384 = 226.8
  CHECK(is(64 + 10 * 72, 438 - static_cast<int>(std::lround(0.1 * 384)), orange));
  // Both colors in the legend row, above the plot area.
  CHECK(count_color(img, 0, 28, 800, 46, blue) > 10);
  CHECK(count_color(img, 0, 28, 800, 46, orange) > 10);
  std::string error;
  try {
    app::plot_lines("t", {{"bad", {{0.0, 1.0}}}}, "x", true);
  } catch (const nd::Error& e) {
    error = e.what();
  }
  CHECK(error == "plot_lines: a log2 x axis needs x > 0, found 0 in 'bad'");
}
