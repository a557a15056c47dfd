// kernels/common/welford.h and batch_norm_index.h on the CPU: the pieces of the CUDA
// batch-norm statistics that can be checked without a GPU.
//  - Welford + Chan against an accurate two-pass reference on adversarial data (mean
//    1e6, spread 5e-4: sum-of-squares keeps no digit of such a variance) and counts 1,
//    2, 3 and 1000003, combined sequentially, as a block-style tree, and over uneven
//    (some empty) pieces.
//  - the chunk split and the index walks against the plain division formulas.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/batch_norm_index.h"
#include "kernels/common/welford.h"

namespace {

using nd::kernels::Welford;
using nd::kernels::welford_add;
using nd::kernels::welford_combine;

// x_i = base + k_i * 2^-20 with |k_i| < 2^10: exact in f64 for |base| < 2^30, and the
// reference works on the small offsets d_i = k_i * 2^-20 where two passes lose nothing.
struct Data {
  std::vector<double> x;
  double mean = 0, m2 = 0;  // reference
};

Data make_data(int64_t n, double base, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> k(-1000, 1000);
  const double unit = std::ldexp(1.0, -20);
  std::vector<double> d(n);
  Data out;
  out.x.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    d[i] = k(gen) * unit;
    out.x[i] = base + d[i];
  }
  double s = 0;
  for (double v : d) s += v;
  const double mean_d = s / static_cast<double>(n);
  for (double v : d) out.m2 += (v - mean_d) * (v - mean_d);
  out.mean = base + mean_d;
  return out;
}

Welford sequential(const std::vector<double>& x, size_t begin, size_t end) {
  Welford w{};
  for (size_t i = begin; i < end; ++i) welford_add(w, x[i]);
  return w;
}

// As a thread block does: lane t takes values t, t + lanes, ...; then a halving tree.
Welford block_tree(const std::vector<double>& x, int lanes) {
  std::vector<Welford> w(lanes, Welford{});
  for (size_t i = 0; i < x.size(); ++i) welford_add(w[i % lanes], x[i]);
  for (int h = lanes / 2; h > 0; h /= 2)
    for (int t = 0; t < h; ++t) w[t] = welford_combine(w[t], w[t + h]);
  return w[0];
}

// Uneven consecutive pieces (sizes 0 included), each summarised, folded left to right.
Welford uneven_pieces(const std::vector<double>& x, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<size_t> len(0, 2 + x.size() / 5);
  Welford total{};
  size_t i = 0;
  while (i < x.size()) {
    const size_t end = std::min(x.size(), i + len(gen));
    total = welford_combine(total, sequential(x, i, end));
    i = end;
  }
  return welford_combine(total, Welford{});  // an empty piece on the right changes nothing
}

void check_summary(const Welford& w, const Data& ref, const char* how) {
  const std::string label = how;
  CAPTURE(label);
  const double n = static_cast<double>(ref.x.size());
  CHECK(w.count == n);
  // |mean| / std is ~2e9 here, so f64 itself resolves the mean to ~1e-7 std; one long
  // sequential Welford chain (the worst grouping) measured 1e-5 std and 4e-8 relative M2.
  const double std_dev = std::sqrt(ref.m2 / n);
  CHECK(std::fabs(w.mean - ref.mean) <= 1e-4 * std_dev + 2e-16 * std::fabs(ref.mean));
  CHECK(std::fabs(w.m2 - ref.m2) <= 1e-6 * ref.m2);
}

}  // namespace

TEST_CASE("welford: counts 1, 2, 3 and 1000003 at mean 1e6 match the two-pass reference in any grouping") {
  for (int64_t n : {1, 2, 3, 1000003}) {
    CAPTURE(n);
    const Data d = make_data(n, 1e6, 7 + n);
    check_summary(sequential(d.x, 0, d.x.size()), d, "sequential");
    check_summary(block_tree(d.x, 256), d, "256-lane tree");
    check_summary(block_tree(d.x, 8), d, "8-lane tree");
    check_summary(uneven_pieces(d.x, 3), d, "uneven pieces");
    // Empty on either side of a combine is the identity.
    const Welford w = sequential(d.x, 0, d.x.size());
    const Welford l = welford_combine(Welford{}, w), r = welford_combine(w, Welford{});
    CHECK((l.count == w.count && l.mean == w.mean && l.m2 == w.m2));
    CHECK((r.count == w.count && r.mean == w.mean && r.m2 == w.m2));
  }
}

TEST_CASE("welford: the data is adversarial: one-pass sum of squares loses the variance that Welford keeps") {
  const Data d = make_data(1000003, 1e6, 11);
  double s = 0, ss = 0;
  for (double v : d.x) {
    s += v;
    ss += v * v;
  }
  const double n = static_cast<double>(d.x.size());
  const double naive_m2 = ss - s * s / n;
  CHECK(std::fabs(naive_m2 - d.m2) > 10 * d.m2);  // wrong by orders of magnitude
  check_summary(block_tree(d.x, 256), d, "256-lane tree");
}

TEST_CASE("welford: single values, constants and the sums handed to SyncBatchNorm") {
  Welford one{};
  welford_add(one, -3.5);
  CHECK((one.count == 1 && one.mean == -3.5 && one.m2 == 0));

  Welford constant{};
  for (int i = 0; i < 1001; ++i) welford_add(constant, 1e9 + 0.25);
  CHECK(constant.mean == 1e9 + 0.25);
  CHECK(constant.m2 == 0);

  // sum = n * mean, sumsq = M2 + n * mean^2 against exact values (small integers).
  Welford w{};
  for (double v : {1.0, 2.0, 4.0, 8.0}) welford_add(w, v);
  CHECK(nd::kernels::welford_sum(w) == doctest::Approx(15.0).epsilon(1e-15));
  CHECK(nd::kernels::welford_sumsq(w) == doctest::Approx(85.0).epsilon(1e-15));
  const Welford halves = welford_combine(sequential({1.0, 2.0}, 0, 2), sequential({4.0, 8.0}, 0, 2));
  CHECK(nd::kernels::welford_sum(halves) == doctest::Approx(15.0).epsilon(1e-15));
  CHECK(nd::kernels::welford_sumsq(halves) == doctest::Approx(85.0).epsilon(1e-15));
}

TEST_CASE("batch_norm_index: channel_chunks covers every value once, no empty chunk, at most max_chunks") {
  for (int64_t values : {int64_t(0), int64_t(1), int64_t(2), int64_t(7), int64_t(255), int64_t(256), int64_t(257), int64_t(4096), int64_t(4097), int64_t(1000003), (int64_t(1) << 20) + 3}) {
    for (int64_t target : {1, 3, 128, 4096}) {
      for (int64_t max_chunks : {1, 2, 5, 1024}) {
        CAPTURE(values);
        CAPTURE(target);
        CAPTURE(max_chunks);
        const auto ch = nd::kernels::channel_chunks(values, target, max_chunks);
        REQUIRE(ch.count >= 1);
        CHECK(ch.count <= max_chunks);
        if (values == 0) {
          CHECK((ch.count == 1 && ch.length == 0));
          continue;
        }
        CHECK(ch.length <= std::max<int64_t>(target, (values + max_chunks - 1) / max_chunks));
        CHECK((ch.count - 1) * ch.length < values);  // the last chunk is not empty
        CHECK(ch.count * ch.length >= values);       // and together they cover everything
      }
    }
  }
}

TEST_CASE("batch_norm_index: channel_walk and element_walk visit what the division formulas say") {
  struct Shape3 {
    int64_t N, C, S;
  };
  for (const Shape3 sh : {Shape3{3, 5, 63}, Shape3{1, 1, 1}, Shape3{7, 3, 1}, Shape3{2, 129, 4}, Shape3{5, 2, 300}}) {
    CAPTURE(sh.N);
    CAPTURE(sh.C);
    CAPTURE(sh.S);
    const int64_t M = sh.N * sh.S, total = sh.N * sh.C * sh.S;
    for (int64_t step : {1, 2, 7, 64, 256, 1000}) {
      CAPTURE(step);
      for (int64_t c = 0; c < sh.C; c += 2) {
        for (int64_t start = 0; start < std::min<int64_t>(M, 5); ++start) {
          auto w = nd::kernels::channel_walk(start, step, sh.C, sh.S, c);
          bool ok = true;
          for (int64_t j = start; j < M; j += step, w.next())
            ok = ok && w.offset == ((j / sh.S) * sh.C + c) * sh.S + j % sh.S;
          CHECK(ok);
        }
      }
      for (int64_t start = 0; start < std::min<int64_t>(total, 9); ++start) {
        auto w = nd::kernels::element_walk(start, step, sh.C, sh.S);
        bool ok = true;
        for (int64_t i = start; i < total; i += step, w.next())
          ok = ok && w.i == i && w.c == (i / sh.S) % sh.C && w.s == i % sh.S;
        CHECK(ok);
      }
    }
  }
}
