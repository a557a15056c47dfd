// kernels/common/online_softmax.h on the CPU: the online softmax fed blocks in any order
// (and states merged in any order), in natural and log2 units, against a direct softmax,
// rows with -inf scores, and the causal tile bounds against brute force over every
// (query, key) pair.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/common/online_softmax.h"

namespace {

using nd::kernels::OnlineSoftmax;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A row of n scores and n value vectors of width ev.
struct Row {
  std::vector<double> s, v;
  int64_t ev;
};

Row random_row(int64_t n, int64_t ev, double masked_fraction, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Row r{std::vector<double>(n), std::vector<double>(n * ev), ev};
  for (auto& s : r.s) s = u(gen) < masked_fraction ? -kInf : normal(gen);
  for (auto& v : r.v) v = normal(gen);
  return r;
}

// Direct: lse = log sum exp(s), out = sum softmax_j v_j (0 and -inf when all are -inf).
struct Result {
  double lse;
  std::vector<double> out;
};

Result direct(const Row& r) {
  Result res{-kInf, std::vector<double>(r.ev, 0.0)};
  const double mx = *std::max_element(r.s.begin(), r.s.end());
  if (mx == -kInf) return res;
  double z = 0;
  for (double s : r.s) z += std::exp(s - mx);
  res.lse = mx + std::log(z);
  for (size_t j = 0; j < r.s.size(); ++j)
    for (int64_t e = 0; e < r.ev; ++e) res.out[e] += std::exp(r.s[j] - res.lse) * r.v[j * r.ev + e];
  return res;
}

// A partial state over the scores [j0, j1) with its weighted sum acc = sum exp(s - m) v
// (kBase2: the state fed log2(e) s, its exps exp2, as the bf16 tensor-core forward does).
template <class T, bool kBase2 = false>
struct Partial {
  OnlineSoftmax<T, kBase2> st;
  std::vector<T> acc;
};

// Feeds the blocks [bounds[b], bounds[b + 1]) in the order `order`, as the kernels do.
template <class T, bool kBase2 = false>
Partial<T, kBase2> online(const Row& r, const std::vector<int64_t>& bounds, const std::vector<size_t>& order) {
  Partial<T, kBase2> p{{}, std::vector<T>(r.ev, T(0))};
  const auto score = [&](int64_t j) { return static_cast<T>(kBase2 ? r.s[j] * 1.4426950408889634 : r.s[j]); };
  for (size_t b : order) {
    T block_max = -static_cast<T>(INFINITY);
    for (int64_t j = bounds[b]; j < bounds[b + 1]; ++j) block_max = std::max(block_max, score(j));
    const T correction = p.st.begin_block(block_max);
    for (auto& a : p.acc) a *= correction;
    for (int64_t j = bounds[b]; j < bounds[b + 1]; ++j) {
      const T w = p.st.weight(score(j));
      p.st.add(w);
      for (int64_t e = 0; e < r.ev; ++e) p.acc[e] += w * static_cast<T>(r.v[j * r.ev + e]);
    }
  }
  return p;
}

template <class T, bool kBase2>
void check_result(const Partial<T, kBase2>& p, const Result& want, double tol) {
  const T lse = p.st.logsumexp();
  if (want.lse == -kInf) {
    CHECK(lse == -static_cast<T>(INFINITY));
  } else {
    CHECK(std::abs(static_cast<double>(lse) - want.lse) <= tol * (1 + std::abs(want.lse)));
  }
  const T inv = p.st.inverse_sum();
  for (size_t e = 0; e < want.out.size(); ++e) {
    const double got = static_cast<double>(p.acc[e] * inv);
    REQUIRE(!std::isnan(got));
    CHECK(std::abs(got - want.out[e]) <= tol * (1 + std::abs(want.out[e])));
  }
}

// Random block boundaries 0 = b0 < b1 < ... < n (blocks of 1 .. 9 scores).
std::vector<int64_t> random_bounds(int64_t n, std::mt19937& gen) {
  std::uniform_int_distribution<int64_t> len(1, 9);
  std::vector<int64_t> b{0};
  while (b.back() < n) b.push_back(std::min(n, b.back() + len(gen)));
  return b;
}

template <class T, bool kBase2 = false>
void blocks_in_any_order(double tol) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 1 + trial % 37;
    const double masked = trial % 3 == 0 ? 0.0 : (trial % 3 == 1 ? 0.5 : 0.95);
    const Row r = random_row(n, 3, masked, 100 + trial);
    const Result want = direct(r);
    const std::vector<int64_t> bounds = random_bounds(n, gen);
    std::vector<size_t> order(bounds.size() - 1);
    std::iota(order.begin(), order.end(), size_t(0));
    for (int shuffle = 0; shuffle < 4; ++shuffle) {
      CAPTURE(trial);
      CAPTURE(shuffle);
      check_result(online<T, kBase2>(r, bounds, order), want, tol);
      std::shuffle(order.begin(), order.end(), gen);
    }
  }
}

}  // namespace

TEST_CASE("online softmax: blocks fed in any order give the direct softmax and logsumexp") {
  blocks_in_any_order<double>(1e-12);
  blocks_in_any_order<float>(2e-5);
}

TEST_CASE("online softmax in log2 units (exp2, natural lse) gives the direct softmax and logsumexp") {
  blocks_in_any_order<double, true>(1e-12);
  blocks_in_any_order<float, true>(2e-5);
  Row r = random_row(5, 2, 1.0, 9);  // every score -inf: lse = -inf, out = 0
  check_result(online<float, true>(r, {0, 5}, {0}), direct(r), 0.0);
}

TEST_CASE("online softmax: merging partial states in either order equals the direct result") {
  std::mt19937 gen(11);
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    const int64_t n = 2 + trial % 29;
    // Trial % 4 == 3: the first half fully masked, so one side of the merge is empty.
    Row r = random_row(n, 2, trial % 4 == 1 ? 0.6 : 0.0, 300 + trial);
    const int64_t half = n / 2;
    if (trial % 4 == 3) std::fill(r.s.begin(), r.s.begin() + half, -kInf);
    const Result want = direct(r);
    const Partial<double> a = online<double>(r, {0, half, n}, {0}), b = online<double>(r, {0, half, n}, {1});
    for (bool swap : {false, true}) {
      const Partial<double>& x = swap ? b : a;
      const Partial<double>& y = swap ? a : b;
      double sx = 0, sy = 0;
      Partial<double> m{nd::kernels::merge(x.st, y.st, &sx, &sy), std::vector<double>(r.ev)};
      for (int64_t e = 0; e < r.ev; ++e) m.acc[e] = x.acc[e] * sx + y.acc[e] * sy;
      check_result(m, want, 1e-12);
    }
  }
}

TEST_CASE("online softmax: rows of -inf give lse = -inf and out = 0, never NaN") {
  for (int64_t n : {1, 5, 17}) {
    Row r = random_row(n, 4, 1.0, 9);  // every score -inf
    const Partial<double> p = online<double>(r, {0, n}, {0});
    CHECK(p.st.l == 0.0);
    check_result(p, direct(r), 0.0);
    // -inf blocks first, then one finite score: the finite score gets all the weight.
    r.s.back() = 0.25;
    std::vector<int64_t> bounds;
    for (int64_t j = 0; j <= n; ++j) bounds.push_back(j);
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    const Partial<double> q = online<double>(r, bounds, order);
    CHECK(q.st.logsumexp() == doctest::Approx(0.25));
    for (int64_t e = 0; e < r.ev; ++e) CHECK(q.acc[e] * q.st.inverse_sum() == doctest::Approx(r.v[(n - 1) * r.ev + e]));
  }
  using nd::kernels::probability_from_lse;
  CHECK(probability_from_lse(-kInf, -kInf) == 0.0);
  CHECK(probability_from_lse(-kInf, 1.5) == 0.0);
  CHECK(probability_from_lse(1.5, 1.5) == 1.0);
  CHECK(probability_from_lse(-INFINITY, -INFINITY) == 0.0f);
}

TEST_CASE("attention tile bounds: causal skipping drops exactly the tiles no row needs") {
  using nd::kernels::attention_allowed;
  using nd::kernels::attention_first_query_tile;
  using nd::kernels::attention_key_end;
  for (bool causal : {false, true}) {
    for (int64_t Sq = 0; Sq <= 11; ++Sq) {
      for (int64_t Sk = 0; Sk <= 11; ++Sk) {
        for (int64_t tile = 1; tile <= 5; ++tile) {
          CAPTURE(causal);
          CAPTURE(Sq);
          CAPTURE(Sk);
          CAPTURE(tile);
          // Query tile [i0, i1) visits keys [0, end): every allowed key is inside, and key
          // end - 1 is allowed for some row (no tail left to skip).
          for (int64_t i0 = 0; i0 < Sq; i0 += tile) {
            const int64_t i1 = std::min(Sq, i0 + tile), end = attention_key_end(i1, Sk, causal);
            CHECK(end <= Sk);
            bool last_needed = end == 0;
            for (int64_t i = i0; i < i1; ++i) {
              for (int64_t j = end; j < Sk; ++j) CHECK_FALSE(attention_allowed(i, j, Sk, causal));
              if (end > 0 && attention_allowed(i, end - 1, Sk, causal)) last_needed = true;
            }
            CHECK(last_needed);
          }
          // Key tile [j0, j1) starts at query tile first: no earlier row sees any of its keys,
          // and the first tile has a row that does (when it exists and the keys do).
          for (int64_t j0 = 0; j0 < Sk; j0 += tile) {
            const int64_t j1 = std::min(Sk, j0 + tile), first = attention_first_query_tile(j0, tile, causal);
            for (int64_t i = 0; i < std::min(Sq, first * tile); ++i)
              for (int64_t j = j0; j < j1; ++j) CHECK_FALSE(attention_allowed(i, j, Sk, causal));
            if (first * tile < Sq) {
              bool needed = false;
              for (int64_t i = first * tile; i < std::min(Sq, (first + 1) * tile); ++i)
                for (int64_t j = j0; j < j1; ++j) needed = needed || attention_allowed(i, j, Sk, causal);
              CHECK(needed);
            }
          }
        }
      }
    }
  }
}

// Checked to fail with attention_keys_seen's causal end at i instead of i + 1 (495 checks) and
// attention_first_query_seeing's first query at j + 1 (540 checks) (never committed).
TEST_CASE("attention tile bounds: a row's range inside a tile is exactly its allowed keys or queries") {
  using nd::kernels::attention_allowed;
  for (bool causal : {false, true}) {
    for (int64_t Sk = 0; Sk <= 9; ++Sk) {
      for (int64_t a0 = 0; a0 <= 9; ++a0) {
        for (int64_t a1 = a0; a1 <= 9; ++a1) {
          for (int64_t other = 0; other <= 10; ++other) {
            CAPTURE(causal);
            CAPTURE(Sk);
            CAPTURE(a0);
            CAPTURE(a1);
            CAPTURE(other);
            if (a1 <= Sk) {  // query `other` against the key tile [a0, a1)
              const int64_t seen = nd::kernels::attention_keys_seen(other, a0, a1, causal);
              for (int64_t c = 0; c < a1 - a0; ++c) CHECK((c < seen) == attention_allowed(other, a0 + c, Sk, causal));
            }
            if (other < Sk) {  // key `other` against the query tile [a0, a1)
              const int64_t first = nd::kernels::attention_first_query_seeing(other, a0, a1, causal);
              CHECK(first >= 0);
              for (int64_t c = 0; c < a1 - a0; ++c) CHECK((c >= first) == attention_allowed(a0 + c, other, Sk, causal));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("attention tile bounds: the 1-D grid covers every (head, tile) once") {
  for (int64_t n_tiles : {1, 3, 7}) {
    for (int64_t BH : {1, 4, 9}) {
      std::vector<int> seen(n_tiles * BH, 0);
      for (int64_t block = 0; block < n_tiles * BH; ++block) {
        const auto t = nd::kernels::tile_of_block(block, n_tiles);
        REQUIRE(t.bh >= 0);
        REQUIRE(t.bh < BH);
        REQUIRE(t.tile >= 0);
        REQUIRE(t.tile < n_tiles);
        ++seen[t.bh * n_tiles + t.tile];
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    }
  }
}
