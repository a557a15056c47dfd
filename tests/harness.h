#pragma once
// The shared op-test harness (ggml's test-backend-ops idea): each op case is a
// small struct that builds its inputs; the same harness runs finite-difference
// gradchecks on contiguous, non-contiguous and batch-1 variants, compares tensors,
// and captures warnings. Tests include this and doctest.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nanoddp.h>

#include "numeric.h"  // random_normal, numeric_grad

namespace nd::testing {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Values of t (any dtype, any layout) as doubles in row-major order.
std::vector<double> to_vector(const Tensor& t);

// Random f64 tensor in [lo, hi); non_contiguous makes it a transposed view (same
// shape) so kernels see real strides.
Tensor random_input(const Shape& shape, uint64_t seed, bool non_contiguous = false, double lo = -1, double hi = 1);

// CHECKs |actual - expected| <= atol + rtol*|expected| elementwise (and equal shapes).
void check_close(const Tensor& actual, const Tensor& expected, double atol, double rtol, const std::string& what);
void check_close(const Tensor& actual, const std::vector<double>& expected, double atol, double rtol,
                 const std::string& what);
// check_close with atol = tol * max|expected| + 1e-7 and rtol = tol: for f32 results
// against goldens computed in f64, where small entries only need the tensor's scale.
void check_close_scaled(const Tensor& actual, const Tensor& expected, double tol, const std::string& what);

// Compares autograd's gradients of sum(fn(inputs) * w) (w random, fixed) with central
// finite differences, for every input that requires grad. Inputs must be f64.
void gradcheck(const std::string& name, const OpFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6,
               double atol = 1e-6, double rtol = 1e-5);

// A table row: op name, input shapes, the function, and the input range.
struct OpCase {
  OpCase(std::string name_, std::vector<Shape> shapes_, OpFn fn_, double lo_ = -1, double hi_ = 1,
         std::vector<bool> differentiable_ = {})
      : name(std::move(name_)), shapes(std::move(shapes_)), fn(std::move(fn_)), lo(lo_), hi(hi_),
        differentiable(std::move(differentiable_)) {}
  std::string name;
  std::vector<Shape> shapes;
  OpFn fn;
  double lo = -1, hi = 1;           // input value range (log/sqrt want lo > 0)
  std::vector<bool> differentiable;  // per input; empty = all
};
// Runs gradcheck on the case with contiguous and with non-contiguous inputs.
void run_gradcheck(const OpCase& c);

// A golden table written by a tests/golden/make_*_golden.py script: one line per row,
// "name v0 v1 ..." (values as Python's repr: nan and inf included), '#' lines skipped;
// REQUIREs that the file exists. Rows by name, in file order within each name.
std::map<std::string, std::vector<double>> read_golden_table(const std::string& path);

// Collects nd::warn messages while alive.
class WarningCapture {
 public:
  WarningCapture();
  ~WarningCapture();
  std::vector<std::string> messages;

 private:
  WarningHandler previous_;
};

// The message of the nd::Error that fn throws; FAILs when it throws nothing.
std::string error_message(const std::function<void()>& fn);

// Mixed-precision helpers (engine/autocast.h tests):
// t's values rounded to bf16, as an f32 tensor outside the graph.
Tensor bf16_rounded(const Tensor& t);
// x's values rounded to bf16 (kernel-level references).
std::vector<float> bf16_rounded(std::vector<float> x);
// The same for autocast's dtype `dtype16` (kBFloat16 or kFloat16).
Tensor rounded(const Tensor& t, ScalarType dtype16);
std::vector<float> rounded(std::vector<float> x, ScalarType dtype16);
// Values of t as floats in row-major order (to_vector's, narrowed).
std::vector<float> to_floats(const Tensor& t);
// Same shape and the same values bit for bit (compared as doubles, so -0 == 0).
bool bitwise_equal(const Tensor& a, const Tensor& b);
// ||a - b|| / ||b|| over all elements (L2).
double relative_error(const Tensor& a, const Tensor& b);
// The losses of `steps` training steps: zero_grad, loss_fn() with autocast on for the CPU
// when `amp` (the backward outside the guard: the nodes remember), backward, opt.step().
std::vector<double> train_losses(optim::Optimizer& opt, const std::function<Tensor()>& loss_fn, int steps, bool amp);

}  // namespace nd::testing
