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

TEST_CASE("reduce: argument errors") {
  auto has = [](const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; };
  CHECK(has(error_message([] { ones({2}).var({0}, 2); }), "leaves no degrees of freedom"));
  CHECK(has(error_message([] { ones({2, 2}).sum({0, 0}); }), "appears multiple times"));
  CHECK(has(error_message([] { ones({2, 2}).sum({2}); }), "dimension out of range"));
  CHECK(has(error_message([] { zeros({0}).max(); }), "zero elements"));
}
