// Tensor basics: factories, dtypes, views sharing the version counter, joins,
// indexing, conversion, printing, argument errors, and pinned memory's errors without a GPU.
#include <sstream>

#include "data/data_loader.h"
#include "harness.h"
#include "kernels/cuda/runtime.h"

using namespace nd;
using nd::testing::check_close;
using nd::testing::error_message;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("tensor: factories and dtypes") {
  Tensor z = zeros({2, 3});
  CHECK(z.sizes() == Shape{2, 3});
  CHECK(z.dtype() == kFloat32);
  CHECK(z.strides() == Shape{3, 1});
  check_close(full({2}, 7, kInt32), {7, 7}, 0, 0, "full i32");
  check_close(arange(5), {0, 1, 2, 3, 4}, 0, 0, "arange");
  check_close(arange(1, 2, 0.25, kFloat64), {1, 1.25, 1.5, 1.75}, 0, 0, "arange step");
  CHECK(ones({3}).sum().item() == 3);
  for (ScalarType t : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32, kUInt8, kBool}) {
    Tensor a = tensor({0, 1, 2}).to(t);
    CHECK(a.dtype() == t);
    check_close(a.to(kFloat64), t == kBool ? std::vector<double>{0, 1, 1} : std::vector<double>{0, 1, 2}, 0, 0,
                dtype_name(t));
  }
  // bf16 and f16 round to nearest even.
  check_close(tensor({1.00390625}).to(kBFloat16), {1.0}, 0, 0, "bf16 rounding");
  check_close(tensor({65504, 1e-7}).to(kFloat16), {65504, 1.1920928955078125e-07}, 0, 0, "f16 range");
}

TEST_CASE("tensor: seeded random numbers repeat exactly") {
  manual_seed(42);
  std::vector<double> a = nd::testing::to_vector(randn({1000}));
  manual_seed(42);
  std::vector<double> b = nd::testing::to_vector(randn({1000}));
  CHECK(a == b);
  double mean = 0, var = 0;
  for (double v : a) mean += v / 1000;
  for (double v : a) var += (v - mean) * (v - mean) / 999;
  CHECK(std::abs(mean) < 0.1);
  CHECK(std::abs(var - 1) < 0.1);
  Tensor r = randint(3, 7, {500});
  CHECK(r.dtype() == kInt64);
  for (double v : nd::testing::to_vector(r)) CHECK((v >= 3 && v < 7));
  Tensor u = rand({500});
  for (double v : nd::testing::to_vector(u)) CHECK((v >= 0 && v < 1));
}

TEST_CASE("tensor: views share storage and the version counter") {
  Tensor x = arange(6).reshape({2, 3});
  Tensor t = x.t();
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.sizes() == Shape{3, 2});
  check_close(t, {0, 3, 1, 4, 2, 5}, 0, 0, "transpose");
  check_close(x.narrow(1, 1, 2), {1, 2, 4, 5}, 0, 0, "narrow");
  check_close(x.slice(1, 0, 3, 2), {0, 2, 3, 5}, 0, 0, "slice step 2");
  check_close(x.select(0, 1), {3, 4, 5}, 0, 0, "select");
  check_close(x.unsqueeze(0).expand({2, 2, 3}), {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, 0, 0, "expand");
  CHECK(x.unsqueeze(1).sizes() == Shape{2, 1, 3});
  CHECK(x.unsqueeze(1).squeeze().sizes() == Shape{2, 3});
  CHECK(x.flatten().sizes() == Shape{6});
  CHECK(x.view({3, -1}).sizes() == Shape{3, 2});

  Tensor d = x.detach();
  Tensor v = x.narrow(0, 1, 1);
  d.add_(1.0);
  CHECK(x._version() == 1);
  CHECK(v._version() == 1);
  check_close(v, {4, 5, 6}, 0, 0, "write through detach is seen by a view");
  v.mul_(2.0);
  CHECK(x._version() == 2);
  check_close(x, {1, 2, 3, 8, 10, 12}, 0, 0, "write through a view");
}

TEST_CASE("tensor: cat, stack, split, index_select, contiguous, clone") {
  Tensor a = arange(4).reshape({2, 2});
  Tensor b = arange(4, 6).reshape({1, 2});
  check_close(cat({a, b}), {0, 1, 2, 3, 4, 5}, 0, 0, "cat dim 0");
  check_close(cat({a, a.t()}, 1), {0, 1, 0, 2, 2, 3, 1, 3}, 0, 0, "cat dim 1 with a transposed input");
  check_close(stack({a, a}, 1), {0, 1, 0, 1, 2, 3, 2, 3}, 0, 0, "stack dim 1");
  auto parts = arange(5).split(2);
  REQUIRE(parts.size() == 3);
  check_close(parts[2], {4}, 0, 0, "split tail");
  Tensor idx = tensor({2, 0, 2}, kInt64);
  check_close(arange(3).index(idx), {2, 0, 2}, 0, 0, "index");
  check_close(a.index_select(1, tensor({1}, kInt64)), {1, 3}, 0, 0, "index_select dim 1");
  Tensor c = a.t().contiguous();
  CHECK(c.is_contiguous());
  check_close(c, {0, 2, 1, 3}, 0, 0, "contiguous");
  Tensor k = a.clone();
  k.add_(1.0);
  check_close(a, {0, 1, 2, 3}, 0, 0, "clone does not alias");
}

TEST_CASE("tensor: gradcheck of views, joins and indexing") {
  using V = std::vector<Tensor>;
  const std::vector<nd::testing::OpCase> cases = {
      {"reshape", {{2, 6}}, [](const V& x) { return x[0].reshape({3, 4}) * 2.0; }},
      {"permute", {{2, 3, 4}}, [](const V& x) { return x[0].permute({2, 0, 1}).contiguous(); }},
      {"narrow", {{4, 5}}, [](const V& x) { return x[0].narrow(1, 1, 3); }},
      {"slice step", {{6, 2}}, [](const V& x) { return x[0].slice(0, 1, 6, 2); }},
      {"select", {{3, 4}}, [](const V& x) { return x[0].select(1, -1); }},
      {"expand", {{3, 1}}, [](const V& x) { return x[0].expand({2, 3, 4}); }},
      {"squeeze/unsqueeze", {{3, 1, 2}}, [](const V& x) { return x[0].squeeze(1).unsqueeze(0); }},
      {"cat", {{2, 3}, {4, 3}}, [](const V& x) { return cat({x[0], x[1]}, 0); }},
      {"stack", {{2, 3}, {2, 3}}, [](const V& x) { return stack({x[0], x[1]}, 2); }},
      {"split", {{5, 2}}, [](const V& x) { return x[0].split(2)[1] * x[0].split(2)[2].sum(); }},
      {"index_select repeats", {{4, 3}},
       [](const V& x) { return x[0].index_select(0, tensor({3, 1, 3}, kInt64)); }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("tensor: the gradient of a dtype conversion comes back in the input's dtype") {
  Tensor x = tensor({1, 2}, kFloat64).requires_grad_();
  Tensor y = x.to(kFloat32);
  CHECK(y.grad_fn()->name() == "ToCopyBackward");
  (y * y).sum().backward();
  CHECK(x.grad().dtype() == kFloat64);
  check_close(x.grad(), {2, 4}, 0, 0, "d/dx sum(x^2) through f32");
}

TEST_CASE("tensor: printing and describe") {
  std::ostringstream os;
  os << tensor({1, 2.5}).reshape({1, 2});
  CHECK(os.str() == "tensor([[1, 2.5]])");
  Tensor w = zeros({64, 1, 4, 4}).set_name("D.main.0.weight");
  CHECK(w.describe() == "[cpu f32 [64, 1, 4, 4]] 'D.main.0.weight'");
  std::ostringstream os2;
  os2 << tensor({1}, kInt64).requires_grad_(false);
  CHECK(os2.str() == "tensor([1], dtype=i64)");
}

TEST_CASE("tensor: argument errors") {
  CHECK(contains(error_message([] { arange(6).view({4, -1}); }), "shape [4, -1] is invalid for input"));
  CHECK(contains(error_message([] { arange(6).reshape({2, 3}).t().view({6}); }), "Use reshape(...) instead"));
  CHECK(contains(error_message([] { zeros({2}).size(3); }), "dimension out of range"));
  CHECK(contains(error_message([] { cat({zeros({2, 3}), zeros({2, 4})}); }), "sizes of tensors must match"));
  CHECK(contains(error_message([] { arange(3).index(tensor({3}, kInt64)); }), "index 3 at position 0 is out of range"));
  CHECK(contains(error_message([] { arange(3).index(tensor({0})); }), "expected a 1-D i64 index"));
  CHECK(contains(error_message([] { zeros({2, 2}).item(); }), "expected a tensor with one element"));
  CHECK(contains(error_message([] { zeros({2}).data_ptr<double>(); }), "expected element type f32"));
  CHECK(contains(error_message([] { Tensor().numel(); }), "undefined tensor"));
  CHECK(contains(error_message([] { zeros({-1}); }), "negative dimension"));
  CHECK(contains(error_message([] { Device("gpu:0"); }), "invalid device 'gpu:0'"));
  CHECK(contains(error_message([] { ones({2}, kInt64).requires_grad_(); }), "only floating point"));
  if (!cuda::is_available()) {
    const std::string msg = error_message([] { zeros({2}).to(Device("cuda:0")); });
    CHECK((contains(msg, "built without CUDA") || contains(msg, "no CUDA GPU is available")));
    const std::string stats = error_message([] { cuda::memory_stats(Device("cuda:0")); });
    CHECK((contains(stats, "built without CUDA") || contains(stats, "no CUDA GPU is available")));
  }
  CHECK(error_message([] { cuda::memory_stats(Device("cpu")); }) ==
        "cuda::memory_stats: expected a CUDA device (cuda:N), found cpu; the CPU allocator's counters are "
        "nd::cpu::memory_stats()");
}

TEST_CASE("tensor: pinned memory without a GPU is an error naming the caller and the reason") {
  if (cuda::is_available()) {
    MESSAGE("SKIPPED: a CUDA GPU is present, so pinned memory works (tests/cuda/cuda_ops_test.cpp)");
    return;
  }
  const std::string why = "pinned host memory needs a CUDA GPU, and none is available (" +
                          kernels::cuda::unavailable_reason() + "); leave pin_memory off on the CPU";
  CHECK(error_message([] { (void)ones({3}).pin_memory(); }) == "pin_memory: " + why);
  CHECK(error_message([] { (void)empty({3}, TensorOptions().pinned_memory(true)); }) == "pinned_memory: " + why);
  const data::Dataset ds{zeros({4, 1, 2, 2}), zeros({4}, TensorOptions(kInt64))};
  CHECK(error_message([&] { data::DataLoader loader(ds, data::DataLoaderOptions(2).pin_memory(true)); }) ==
        "DataLoader (pin_memory): " + why);
  // A non-blocking copy of pageable memory is an ordinary copy: to the CPU, a no-op.
  const Tensor x = ones({3});
  CHECK(x.to(Device(kCPU), /*non_blocking=*/true).storage() == x.storage());
  CHECK(!x.is_pinned());
}
