// Reductions: gradcheck table, known values, argument errors.
#include "harness.h"

using namespace nd;
using nd::testing::check_close;
using nd::testing::error_message;

TEST_CASE("reduce: gradcheck table") {
  using V = std::vector<Tensor>;
  const std::vector<nd::testing::OpCase> cases = {
      {"sum all", {{3, 4}}, [](const V& x) { return x[0].sum(); }},
      {"sum dim 0", {{3, 4}}, [](const V& x) { return x[0].sum({0}); }},
      {"sum dims keepdim", {{2, 3, 4}}, [](const V& x) { return x[0].sum({0, 2}, true); }},
      {"sum leading dims", {{2, 3, 4}}, [](const V& x) { return x[0].sum({0, 1}); }},
      {"mean leading dims keepdim", {{3, 2, 5}}, [](const V& x) { return x[0].mean({0}, true); }},
      {"mean", {{3, 4}}, [](const V& x) { return x[0].mean({-1}); }},
      {"mean all", {{1, 5}}, [](const V& x) { return x[0].mean(); }},
      {"var unbiased", {{3, 5}}, [](const V& x) { return x[0].var({1}); }},
      {"var population keepdim", {{2, 3, 4}}, [](const V& x) { return x[0].var({0, 2}, 0, true); }},
      {"max all", {{3, 4}}, [](const V& x) { return x[0].max(); }},
      {"max dim", {{3, 4}}, [](const V& x) { return std::get<0>(max(x[0], 0)); }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("reduce: known values") {
  Tensor x = tensor({1, 2, 3, 4, 5, 6}).reshape({2, 3});
  check_close(x.sum(), {21}, 0, 0, "sum");
  check_close(x.sum({0}), {5, 7, 9}, 0, 0, "sum dim 0");
  check_close(x.mean({1}, true), {2, 5}, 0, 0, "mean keepdim");
  check_close(x.var({1}), {1, 1}, 1e-6, 0, "unbiased var of 1,2,3");
  check_close(x.var({0}, 0), {2.25, 2.25, 2.25}, 1e-6, 0, "population var");
  check_close(tensor({3, 9, 9, 1}).argmax(0), {1}, 0, 0, "argmax takes the first maximum");
  auto [values, indices] = max(x, 1);
  check_close(values, {3, 6}, 0, 0, "max values");
  check_close(indices, {2, 2}, 0, 0, "max indices");
  CHECK(indices.dtype() == kInt64);
}

// The reduction as the engine did it before sum_columns: reduced dims moved last by a
// contiguous copy, then row sums (a trailing-dims sum never takes the column path).
Tensor sum_of_permuted_copy(const Tensor& x, const Shape& dims, bool keepdim, bool is_mean) {
  std::vector<bool> reduced(x.dim(), false);
  for (int64_t d : dims) reduced[d] = true;
  Shape order, trailing, out_shape;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!reduced[d]) {
      order.push_back(d);
      out_shape.push_back(x.size(d));
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  for (int64_t d = 0; d < x.dim(); ++d)
    if (reduced[d]) {
      trailing.push_back(static_cast<int64_t>(order.size()));
      order.push_back(d);
    }
  Tensor rows = x.permute(order).contiguous();
  return (is_mean ? rows.mean(trailing) : rows.sum(trailing)).reshape(out_shape);
}

TEST_CASE("reduce: sums over leading dims (read in place on the CPU) against the permuted copy") {
  struct Case {
    std::string name;
    std::function<Tensor(ScalarType)> make;
    Shape dims;
  };
  auto rand_of = [](const Shape& shape, uint64_t seed, ScalarType dtype) {
    return nd::testing::random_input(shape, seed).to(dtype);
  };
  const std::vector<Case> cases = {
      {"contiguous, first dim", [&](ScalarType t) { return rand_of({5, 7, 9}, 1, t); }, {0}},
      {"contiguous, bias gradient [N, T, D] -> [D]", [&](ScalarType t) { return rand_of({5, 7, 9}, 2, t); }, {0, 1}},
      {"size-1 dim between the reduced ones", [&](ScalarType t) { return rand_of({4, 1, 6, 3}, 3, t); }, {0, 2}},
      {"rows of a wider array (ld > C)", [&](ScalarType t) { return rand_of({5, 7, 12}, 4, t).narrow(2, 0, 9); }, {0, 1}},
      {"every other row", [&](ScalarType t) { return rand_of({10, 7, 9}, 5, t).slice(0, 0, 10, 2); }, {0}},
      {"expanded (ld = 0)", [&](ScalarType t) { return rand_of({9}, 6, t).expand({5, 7, 9}); }, {0, 1}},
      {"kept dims not contiguous (copy path)", [&](ScalarType t) { return rand_of({5, 7, 12}, 7, t).narrow(2, 0, 9); }, {0}},
      {"transposed (copy path)", [&](ScalarType t) { return rand_of({6, 8}, 8, t).t(); }, {0}},
      {"trailing dims (row path)", [&](ScalarType t) { return rand_of({5, 7, 9}, 9, t); }, {1, 2}},
      {"one kept column (row path)", [&](ScalarType t) { return rand_of({40, 1}, 10, t); }, {0}},
      {"large, one column chunk", [&](ScalarType t) { return rand_of({130, 50, 16}, 11, t); }, {0, 1}},
      {"large, columns split over threads", [&](ScalarType t) { return rand_of({64, 13, 257}, 12, t); }, {0, 1}},
      {"empty reduced dim", [&](ScalarType t) { return rand_of({0, 4}, 13, t); }, {0}},
      {"empty kept dim", [&](ScalarType t) { return rand_of({3, 0}, 14, t); }, {0}},
  };
  for (const auto& c : cases)
    for (ScalarType dtype : {kFloat32, kFloat64})
      for (bool keepdim : {false, true})
        for (bool is_mean : {false, true}) {
          const Tensor x = c.make(dtype);
          if (is_mean && x.numel() == 0) continue;  // mean of nothing is an error, checked below
          CAPTURE(c.name);
          CAPTURE(dtype == kFloat32);
          CAPTURE(keepdim);
          CAPTURE(is_mean);
          const Tensor actual = is_mean ? x.mean(c.dims, keepdim) : x.sum(c.dims, keepdim);
          CHECK(actual.dtype() == dtype);
          const double tol = dtype == kFloat32 ? 1e-6 : 1e-13;
          check_close(actual, sum_of_permuted_copy(x, c.dims, keepdim, is_mean), tol, tol, c.name);
        }
  // Known values through the column path: [[1, 2], [3, 4], [5, 6]] -> [9, 12], mean [3, 4].
  Tensor x = tensor({1, 2, 3, 4, 5, 6}).reshape({3, 1, 2});
  check_close(x.sum({0, 1}), {9, 12}, 0, 0, "column sums");
  check_close(x.mean({0}, true), {3, 4}, 0, 0, "column means");
  check_close(zeros({0, 3}).sum({0}), {0, 0, 0}, 0, 0, "sum over no rows");
}

TEST_CASE("reduce: argument errors") {
  auto has = [](const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; };
  CHECK(has(error_message([] { ones({2}).var({0}, 2); }), "leaves no degrees of freedom"));
  CHECK(has(error_message([] { ones({2, 2}).sum({0, 0}); }), "appears multiple times"));
  CHECK(has(error_message([] { ones({2, 2}).sum({2}); }), "dimension out of range"));
  CHECK(has(error_message([] { zeros({0}).max(); }), "zero elements"));
  CHECK(has(error_message([] { zeros({0, 3}).mean({0}); }), "mean over zero elements"));
}
