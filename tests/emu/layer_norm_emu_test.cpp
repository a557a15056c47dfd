// kernels/cuda/layer_norm.cu in the emulator against kernels/cpu/layer_norm.cpp: forward and
// backward (dx, dweight, dbias), f32 and f64, with and without weight/bias, rows of one
// partial warp (D = 7), several warps (D = 100) and 256 threads striding (D = 700), and the
// column kernel for dweight/dbias with a partial last column block.
//
// Tolerance: each output is a short formula around sums over a row (D terms: mean, var,
// mean_d(g), mean_d(g xhat)) or over the rows (M terms: dweight, dbias) that the two sides
// add in different orders, each within 2 gamma_n of the sum of its |terms|, which the
// tensor's largest |value| times n bounds for these inputs; 4 (n + 16) u of that largest
// value (u of T) covers them and the elementwise roundings.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "emu_test.h"
#include "engine/error.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cuda/layer_norm.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

template <class T>
void check_layer_norm(int64_t M, int64_t D, bool affine) {
  INFO("M = ", M, ", D = ", D, std::string(affine ? " affine" : ""), std::string(sizeof(T) == 4 ? " f32" : " f64"));
  const auto x = cast<T>(uniform(M * D, 1, -1, 3)), dy = cast<T>(uniform(M * D, 2)),
             w = cast<T>(uniform(D, 3, 0.5, 1.5)), b = cast<T>(uniform(D, 4));
  const T* wp = affine ? w.data() : nullptr;
  const T* bp = affine ? b.data() : nullptr;
  std::vector<T> y1(M * D), mean1(M), rstd1(M);
  auto y2 = nans<T>(M * D), mean2 = nans<T>(M), rstd2 = nans<T>(M);
  cpu::layer_norm_forward<T>(x.data(), wp, bp, M, D, 1e-5, y1.data(), mean1.data(), rstd1.data());
  cuda::layer_norm_forward<T>(x.data(), wp, bp, M, D, 1e-5, y2.data(), mean2.data(), rstd2.data(), nullptr);
  check_rel("y", y2, y1, rel_for<T>(D));
  check_rel("mean", mean2, mean1, rel_for<T>(D));
  check_rel("rstd", rstd2, rstd1, rel_for<T>(D));

  std::vector<T> dx1(M * D), dw1(D), db1(D);
  auto dx2 = nans<T>(M * D), dw2 = nans<T>(D), db2 = nans<T>(D);
  cpu::layer_norm_backward<T>(dy.data(), x.data(), mean1.data(), rstd1.data(), wp, M, D, dx1.data(),
                              affine ? dw1.data() : nullptr, affine ? db1.data() : nullptr);
  cuda::layer_norm_backward<T>(dy.data(), x.data(), mean1.data(), rstd1.data(), wp, M, D, dx2.data(),
                               affine ? dw2.data() : nullptr, affine ? db2.data() : nullptr, nullptr);
  check_rel("dx", dx2, dx1, rel_for<T>(D));
  if (!affine) return;
  check_rel("dweight", dw2, dw1, rel_for<T>(M));
  check_rel("dbias", db2, db1, rel_for<T>(M));
}

TEST_CASE("layer_norm f32: one partial warp, several warps, 256 threads striding, dweight columns") {
  check_layer_norm<float>(5, 7, true);
  check_layer_norm<float>(3, 100, true);
  check_layer_norm<float>(4, 700, true);
  check_layer_norm<float>(6, 45, false);
  check_layer_norm<float>(70, 40, true);  // dweight/dbias over more rows than one column pass
}

TEST_CASE("layer_norm f64") {
  check_layer_norm<double>(5, 7, true);
  check_layer_norm<double>(4, 700, false);
}

// dweight and dbias alone (dx null, as for a frozen input): the rows are split across blocks
// of kChunkRows rows, each block a tile of 32 columns, and the blocks' partial sums are added
// in block order, so the result is the same bits on every run.
constexpr int64_t kChunkRows = 128;  // layer_norm.cu: 8 row lanes x 16 rows each

template <class T>
void check_param_grads(int64_t M, int64_t D) {
  INFO("M = ", M, ", D = ", D, std::string(sizeof(T) == 4 ? " f32" : " f64"));
  const auto x = cast<T>(uniform(M * D, 5, -1, 3)), dy = cast<T>(uniform(M * D, 6));
  std::vector<T> y(M * D), mean(M), rstd(M), dw1(D), db1(D);
  cpu::layer_norm_forward<T>(x.data(), nullptr, nullptr, M, D, 1e-5, y.data(), mean.data(), rstd.data());
  cpu::layer_norm_backward<T>(dy.data(), x.data(), mean.data(), rstd.data(), nullptr, M, D, nullptr, dw1.data(),
                              db1.data());
  auto run = [&] {
    auto dw = nans<T>(D), db = nans<T>(D);
    const auto launches = launches_of([&] {
      cuda::layer_norm_backward<T>(dy.data(), x.data(), mean.data(), rstd.data(), nullptr, M, D, nullptr, dw.data(),
                                   db.data(), nullptr);
    });
    // One launch: a block per 32 columns and per kChunkRows rows (so the MAE's 1 to 6 column
    // tiles over thousands of rows fill the GPU), whatever the split.
    REQUIRE(launches.size() == 1);
    CHECK(launches[0].grid[0] == unsigned((D + 31) / 32));
    CHECK(launches[0].grid[1] == unsigned(std::max<int64_t>(1, (M + kChunkRows - 1) / kChunkRows)));
    return std::pair{dw, db};
  };
  const auto [dw2, db2] = run();
  check_rel("dweight", dw2, dw1, rel_for<T>(M));
  check_rel("dbias", db2, db1, rel_for<T>(M));
  const auto [dw3, db3] = run();
  CHECK_MESSAGE(same_bits(dw2, dw3), "dweight not bit-reproducible");
  CHECK_MESSAGE(same_bits(db2, db3), "dbias not bit-reproducible");
}

TEST_CASE("layer_norm dweight and dbias: rows split across blocks, partial tiles, bit-reproducible") {
  check_param_grads<float>(1, 32);
  check_param_grads<float>(129, 33);    // one row into a second chunk, one column into a second tile
  check_param_grads<float>(1000, 100);  // a partial last chunk (1000 = 7 x 128 + 104)
  check_param_grads<float>(5000, 192);  // the MAE's width at its rows per step
  check_param_grads<float>(300, 1024);
  check_param_grads<double>(700, 40);
  check_param_grads<float>(0, 40);  // no rows: zero gradients
}

TEST_CASE("layer_norm rows of no element are an nd::Error") {
  std::vector<float> x(4), mean(2), rstd(2);
  CHECK_THROWS_WITH_AS(cuda::layer_norm_forward<float>(x.data(), nullptr, nullptr, 2, 0, 1e-5, x.data(), mean.data(),
                                                       rstd.data(), nullptr),
                       doctest::Contains("expected rows of at least one element, found D = 0"), nd::Error);
}

}  // namespace
