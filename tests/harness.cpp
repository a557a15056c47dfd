#include "harness.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "kernels/common/float16.h"

namespace nd::testing {

std::vector<double> to_vector(const Tensor& t) {
  Tensor c = t.to(kFloat64).contiguous().cpu();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

Tensor random_input(const Shape& shape, uint64_t seed, bool non_contiguous, double lo, double hi) {
  Generator g{seed, 0};
  NoGradGuard no_grad;
  if (!non_contiguous || shape.size() < 2) {
    Tensor t = rand(shape, kFloat64, &g) * (hi - lo) + lo;
    if (non_contiguous && shape.size() == 1) {  // every other element of a 2x longer tensor
      Tensor big = rand({shape[0] * 2}, kFloat64, &g) * (hi - lo) + lo;
      return big.slice(0, 0, shape[0] * 2, 2).detach();
    }
    return t.detach();
  }
  Shape swapped = shape;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  Tensor t = rand(swapped, kFloat64, &g) * (hi - lo) + lo;
  return t.transpose(-1, -2).detach();
}

void check_close(const Tensor& actual, const std::vector<double>& expected, double atol, double rtol,
                 const std::string& what) {
  std::vector<double> a = to_vector(actual);
  REQUIRE_MESSAGE(a.size() == expected.size(), what, ": ", a.size(), " elements, expected ", expected.size());
  int reported = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tol = atol + rtol * std::abs(expected[i]);
    const bool ok = std::abs(a[i] - expected[i]) <= tol || (std::isnan(a[i]) && std::isnan(expected[i]));
    if (!ok && reported++ < 5) FAIL_CHECK(what, ": element ", i, " is ", a[i], ", expected ", expected[i]);
  }
  CHECK_MESSAGE(reported == 0, what, ": ", reported, " element(s) out of tolerance");
}

void check_close(const Tensor& actual, const Tensor& expected, double atol, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(actual.sizes() == expected.sizes(), what, ": shape ", shape_str(actual.sizes()), " vs expected ",
                  shape_str(expected.sizes()));
  check_close(actual, to_vector(expected), atol, rtol, what);
}

void check_close_scaled(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  double scale = 0;
  for (double v : to_vector(expected)) scale = std::max(scale, std::abs(v));
  check_close(actual, expected, tol * scale + 1e-7, tol, what);
}

namespace {
double loss_value(const OpFn& fn, const std::vector<Tensor>& inputs, const Tensor& w) {
  NoGradGuard no_grad;
  return (fn(inputs) * w).sum().item();
}
}  // namespace

void gradcheck(const std::string& name, const OpFn& fn, const std::vector<Tensor>& inputs, double eps, double atol,
               double rtol) {
  Tensor y = fn(inputs);
  Generator g{1234, 0};
  Tensor w = randn(y.sizes(), y.options(), &g);
  Tensor loss = (y * w).sum();
  std::vector<Tensor> wrt;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) wrt.push_back(t);
  REQUIRE_MESSAGE(!wrt.empty(), name, ": no input requires grad");
  std::vector<Tensor> analytic = autograd::grad({loss}, wrt, {}, false, /*allow_unused=*/true);
  for (size_t k = 0; k < wrt.size(); ++k) {
    const Tensor& x = wrt[k];
    REQUIRE_MESSAGE(x.dtype() == kFloat64, name, ": gradcheck needs f64 inputs");
    std::vector<double> numeric(x.numel());
    Shape index(x.dim(), 0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t offset = 0;
      for (int64_t d = 0; d < x.dim(); ++d) offset += index[d] * x.stride(d);
      double* p = x.data_ptr<double>() + offset;
      const double orig = *p;
      *p = orig + eps;
      const double plus = loss_value(fn, inputs, w);
      *p = orig - eps;
      const double minus = loss_value(fn, inputs, w);
      *p = orig;
      numeric[i] = (plus - minus) / (2 * eps);
      for (int64_t d = x.dim() - 1; d >= 0; --d) {
        if (++index[d] < x.size(d)) break;
        index[d] = 0;
      }
    }
    const std::string what = name + ": d/d(input " + std::to_string(k) + " " + shape_str(x.sizes()) + ")";
    if (!analytic[k].defined()) {
      for (double v : numeric) CHECK_MESSAGE(std::abs(v) <= atol, what, ": no analytic gradient but numeric ", v);
      continue;
    }
    check_close(analytic[k], numeric, atol, rtol, what);
  }
}

void run_gradcheck(const OpCase& c) {
  for (bool non_contiguous : {false, true}) {
    std::vector<Tensor> inputs;
    uint64_t seed = 17;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      Tensor t = random_input(c.shapes[i], seed++, non_contiguous, c.lo, c.hi);
      if (c.differentiable.empty() || c.differentiable[i]) t.requires_grad_(true);
      inputs.push_back(t);
    }
    gradcheck(c.name + (non_contiguous ? " (non-contiguous)" : ""), c.fn, inputs);
  }
}

WarningCapture::WarningCapture() {
  previous_ = set_warning_handler([this](const std::string& m) { messages.push_back(m); });
}
WarningCapture::~WarningCapture() { set_warning_handler(previous_); }

std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL_CHECK("expected an nd::Error, but nothing was thrown");
  return "";
}

Tensor bf16_rounded(const Tensor& t) {
  NoGradGuard no_grad;
  return t.to(kBFloat16).to(kFloat32);
}

std::vector<float> bf16_rounded(std::vector<float> x) {
  for (float& v : x) v = static_cast<float>(BFloat16(v));
  return x;
}

std::map<std::string, std::vector<double>> read_golden_table(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), path, " is missing");
  std::map<std::string, std::vector<double>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name, v;
    ls >> name;
    while (ls >> v) out[name].push_back(std::stod(v));  // stod, unlike >>, reads nan and inf
  }
  return out;
}

Tensor rounded(const Tensor& t, ScalarType dtype16) {
  NoGradGuard no_grad;
  return t.to(dtype16).to(kFloat32);
}

std::vector<float> rounded(std::vector<float> x, ScalarType dtype16) {
  if (dtype16 == kBFloat16) return bf16_rounded(std::move(x));
  for (float& v : x) v = static_cast<float>(Half(v));
  return x;
}

std::vector<float> to_floats(const Tensor& t) {
  const std::vector<double> d = to_vector(t);
  return std::vector<float>(d.begin(), d.end());
}

bool bitwise_equal(const Tensor& a, const Tensor& b) { return a.sizes() == b.sizes() && to_vector(a) == to_vector(b); }

std::vector<double> train_losses(optim::Optimizer& opt, const std::function<Tensor()>& loss_fn, int steps, bool amp) {
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard guard(kCPU, amp);
      loss = loss_fn();
    }
    loss.backward();
    opt.step();
    losses.push_back(loss.item());
  }
  return losses;
}

double relative_error(const Tensor& a, const Tensor& b) {
  const auto x = to_vector(a), y = to_vector(b);
  double d = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) d += (x[i] - y[i]) * (x[i] - y[i]), n += y[i] * y[i];
  return std::sqrt(d / n);
}

}  // namespace nd::testing
