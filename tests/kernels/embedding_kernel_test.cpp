// Embedding kernels: gather, bad-index report, scatter-add with repeats and padding_idx.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "kernels/cpu/embedding.h"

using namespace nd::kernels::cpu;

TEST_CASE("embedding forward: known rows and bad index report") {
  const std::vector<double> w = {0, 1, 10, 11, 20, 21};  // 3 x 2
  const std::vector<int64_t> idx = {2, 0, 2};
  std::vector<double> out(6, -1.0);
  CHECK(embedding_forward<double>(w.data(), 3, 2, idx.data(), 3, out.data()) == -1);
  CHECK(out == std::vector<double>{20, 21, 0, 1, 20, 21});
  const std::vector<int64_t> bad = {1, 3, -1};
  std::vector<double> untouched(6, -1.0);
  CHECK(embedding_forward<double>(w.data(), 3, 2, bad.data(), 3, untouched.data()) == 1);
  CHECK(untouched == std::vector<double>(6, -1.0));
  const std::vector<int64_t> negative = {0, -1};
  CHECK(embedding_forward<double>(w.data(), 3, 2, negative.data(), 2, out.data()) == 1);
}

TEST_CASE("embedding backward: scatter-add with repeats and padding_idx (odd sizes, f32)") {
  const int64_t V = 11, D = 131, n = 37;  // D spans several column blocks
  std::mt19937 gen(3);
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  std::normal_distribution<float> normal;
  std::vector<int64_t> idx(n);
  for (auto& i : idx) i = pick(gen);
  idx[5] = idx[9] = 4;  // repeats
  std::vector<float> dout(n * D);
  for (auto& g : dout) g = normal(gen);
  for (int64_t padding : {int64_t(-1), int64_t(4)}) {
    CAPTURE(padding);
    std::vector<float> dw(V * D, 123.0f);  // must be overwritten, not accumulated
    embedding_backward<float>(dout.data(), idx.data(), n, V, D, padding, dw.data());
    std::vector<double> ref(V * D, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      if (idx[i] == padding) continue;
      for (int64_t d = 0; d < D; ++d) ref[idx[i] * D + d] += dout[i * D + d];
    }
    for (int64_t i = 0; i < V * D; ++i) CHECK(dw[i] == doctest::Approx(ref[i]).epsilon(1e-5));
    if (padding == 4) CHECK(dw[4 * D] == 0.0f);
  }
  // Known value: two lookups of row 1 add up.
  const std::vector<int64_t> two = {1, 1};
  const std::vector<double> g = {1, 2, 3, 4};
  std::vector<double> dw(3 * 2);
  embedding_backward<double>(g.data(), two.data(), 2, 3, 2, -1, dw.data());
  CHECK(dw == std::vector<double>{0, 0, 4, 6, 0, 0});
}
