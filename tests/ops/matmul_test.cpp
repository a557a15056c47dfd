// mm, addmm, bmm, matmul: gradcheck table (f64; 1-D/2-D/batched, broadcast batch dims,
// transposed and non-contiguous operands, batch size 1), known values, shapes,
// argument errors, and which inputs MmBackward saves.
#include "engine/ops/matmul.h"

#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("matmul: gradcheck table (f64, broadcast, non-contiguous)") {
  using V = std::vector<Tensor>;
  const std::vector<OpCase> cases = {
      {"mm", {{3, 4}, {4, 5}}, [](const V& x) { return mm(x[0], x[1]); }},
      {"mm transposed operand", {{4, 3}, {4, 5}}, [](const V& x) { return mm(x[0].t(), x[1]); }},
      {"mm row x column", {{1, 4}, {4, 1}}, [](const V& x) { return mm(x[0], x[1]); }},
      {"addmm bias", {{5}, {3, 4}, {4, 5}}, [](const V& x) { return addmm(x[0], x[1], x[2]); }},
      {"addmm full input, transposed mat2", {{3, 5}, {3, 4}, {5, 4}},
       [](const V& x) { return addmm(x[0], x[1], x[2].t()); }},
      {"addmm column input", {{3, 1}, {3, 4}, {4, 2}}, [](const V& x) { return addmm(x[0], x[1], x[2]); }},
      {"bmm", {{2, 3, 4}, {2, 4, 5}}, [](const V& x) { return bmm(x[0], x[1]); }},
      {"bmm batch size 1", {{1, 3, 2}, {1, 2, 4}}, [](const V& x) { return bmm(x[0], x[1]); }},
      {"matmul dot", {{5}, {5}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul vector-matrix", {{4}, {4, 3}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul matrix-vector", {{3, 4}, {4}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul batched x matrix", {{2, 3, 4}, {4, 5}}, [](const V& x) { return x[0].matmul(x[1]); }},
      {"matmul batched x vector", {{2, 3, 4}, {4}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul vector x batched", {{4}, {2, 4, 3}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul matrix x batched", {{3, 4}, {2, 4, 5}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul broadcast 4-D x 3-D", {{2, 1, 3, 4}, {3, 4, 2}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul broadcast batch 1 vs 3", {{1, 3, 4}, {3, 4, 2}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul batch size 1", {{1, 1, 4}, {1, 4, 1}}, [](const V& x) { return matmul(x[0], x[1]); }},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("matmul: known values worked by hand") {
  // [[1,2],[3,4]] [[5,6],[7,8]] = [[1*5+2*7, 1*6+2*8], [3*5+4*7, 3*6+4*8]] = [[19,22],[43,50]]
  Tensor a = tensor({1, 2, 3, 4}, kFloat64).reshape({2, 2}).requires_grad_();
  Tensor b = tensor({5, 6, 7, 8}, kFloat64).reshape({2, 2}).requires_grad_();
  Tensor c = mm(a, b);
  nd::testing::check_close(c, {19, 22, 43, 50}, 0, 0, "mm");
  CHECK(c.grad_fn()->name() == "MmBackward");
  // d sum(AB)/dA = 1 B^T: each row is B's row sums (5+6, 7+8); d/dB = A^T 1: A's column sums.
  c.sum().backward();
  nd::testing::check_close(a.grad(), {11, 15, 11, 15}, 0, 0, "dA");
  nd::testing::check_close(b.grad(), {4, 4, 6, 6}, 0, 0, "dB");
  // dot: 1*4 + 2*5 + 3*6 = 32, a 0-d tensor
  Tensor d = matmul(tensor({1, 2, 3}), tensor({4, 5, 6}));
  CHECK(d.dim() == 0);
  CHECK(d.item() == 32);
  // f32 against the same numbers, through a transposed view: [[1,3],[2,4]]^T = a
  Tensor at = tensor({1, 3, 2, 4}).reshape({2, 2}).t();
  nd::testing::check_close(at.matmul(tensor({5, 6, 7, 8}).reshape({2, 2})), {19, 22, 43, 50}, 0, 0, "mm f32 t()");
  CHECK(bmm(ones({3, 2, 4}), ones({3, 4, 5})).grad_fn() == nullptr);
}

TEST_CASE("addmm: the product accumulates onto the broadcast input, which is left unchanged") {
  // [10, 20] + [[1,2],[3,4]] [[5,6],[7,8]] = [[29, 42], [53, 70]]
  Tensor bias = tensor({10, 20}, kFloat64).requires_grad_();
  Tensor a = tensor({1, 2, 3, 4}, kFloat64).reshape({2, 2}).requires_grad_();
  Tensor b = tensor({5, 6, 7, 8}, kFloat64).reshape({2, 2});
  Tensor c = addmm(bias, a, b);
  nd::testing::check_close(c, {29, 42, 53, 70}, 0, 0, "addmm");
  nd::testing::check_close(bias, {10, 20}, 0, 0, "input untouched");
  CHECK(c.grad_fn()->name() == "AddmmBackward");
  c.backward(tensor({1, 2, 3, 4}, kFloat64).reshape({2, 2}));
  nd::testing::check_close(bias.grad(), {4, 6}, 0, 0, "d bias = column sums of g");
  // d a = g b^T = [[1*5+2*6, 1*7+2*8], [3*5+4*6, 3*7+4*8]]
  nd::testing::check_close(a.grad(), {17, 23, 39, 53}, 0, 0, "d a");
  // A full [n, p] input is copied, not written: the same tensor twice gives the same result.
  Tensor full = tensor({1, 1, 1, 1}).reshape({2, 2});
  nd::testing::check_close(addmm(full, ones({2, 3}), ones({3, 2})), {4, 4, 4, 4}, 0, 0, "once");
  nd::testing::check_close(addmm(full, ones({2, 3}), ones({3, 2})), {4, 4, 4, 4}, 0, 0, "again");
  nd::testing::check_close(full, {1, 1, 1, 1}, 0, 0, "full input untouched");
  // Empty inner dimension: the input broadcast alone.
  nd::testing::check_close(addmm(tensor({7, 8}), ones({3, 0}), ones({0, 2})), {7, 8, 7, 8, 7, 8}, 0, 0, "k = 0");
  // Saved tensors are version-checked: changing mat1 (needed for d mat2) is the usual error.
  Tensor w = ones({2, 2}).requires_grad_();
  Tensor x = ones({3, 2});
  Tensor y = addmm(zeros({2}), x, w);
  x.add_(1.0);
  const std::string msg = nd::testing::error_message([&] { y.sum().backward(); });
  CHECK_MESSAGE(msg.find("saved by AddmmBackward") != std::string::npos, msg);
}

TEST_CASE("matmul: result shapes follow torch.matmul") {
  CHECK(matmul(ones({4}), ones({4, 3})).sizes() == Shape{3});
  CHECK(matmul(ones({3, 4}), ones({4})).sizes() == Shape{3});
  CHECK(matmul(ones({7, 3, 4}), ones({4})).sizes() == Shape{7, 3});
  CHECK(matmul(ones({4}), ones({7, 4, 5})).sizes() == Shape{7, 5});
  CHECK(matmul(ones({2, 1, 3, 4}), ones({5, 4, 6})).sizes() == Shape{2, 5, 3, 6});
  CHECK(matmul(ones({3, 0}), ones({0, 2})).sizes() == Shape{3, 2});
  nd::testing::check_close(matmul(ones({3, 0}), ones({0, 2})), std::vector<double>(6, 0.0), 0, 0, "empty K");
  CHECK(matmul(ones({2, 3, 0}), ones({0, 4})).sizes() == Shape{2, 3, 4});
  CHECK(matmul(ones({0, 3, 2}), ones({2, 4})).sizes() == Shape{0, 3, 4});
  CHECK(matmul(ones({2, 0, 3}), ones({2, 3, 4})).sizes() == Shape{2, 0, 4});
  Tensor big = matmul(ones({2, 3, 5}), full({5, 2}, 2.0));
  nd::testing::check_close(big, std::vector<double>(12, 10.0), 0, 0, "folded batch");
}

TEST_CASE("matmul: argument errors name what was expected and found") {
  using nd::testing::error_message;
  auto has = [](const std::string& msg, const std::string& part) {
    CHECK_MESSAGE(msg.find(part) != std::string::npos, "message: ", msg);
  };
  has(error_message([] { mm(ones({2, 3}), ones({4, 5})); }),
      "mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5): expected mat2 with 3 rows, found [cpu f32 [4, 5]]");
  has(error_message([] { mm(ones({2, 3, 4}), ones({4, 5})); }),
      "mm: expected a 2-D tensor (mat1 [n, m]), found [cpu f32 [2, 3, 4]]");
  has(error_message([] { bmm(ones({2, 3, 4}), ones({3, 4, 5})); }),
      "bmm: expected batch2 with the batch size of batch1 (2), found [cpu f32 [3, 4, 5]]");
  has(error_message([] { bmm(ones({2, 3, 4}), ones({2, 3, 5})); }), "expected batch2 with 4 rows per matrix");
  has(error_message([] { mm(ones({2, 2}), ones({2, 2}, kFloat64)); }), "same dtype");
  has(error_message([] { mm(ones({2, 2}, kInt64), ones({2, 2}, kInt64)); }),
      "mm: expected a f32 or f64 tensor, found [cpu i64 [2, 2]]");
  has(error_message([] { matmul(scalar_tensor(1.0), ones({2})); }), "matmul: both arguments need at least 1 dimension");
  has(error_message([] { matmul(ones({2, 3, 4}), ones({2, 3, 5})); }),
      "expected b's second-to-last dimension to be 4 (a's last dimension), found 3");
  has(error_message([] { matmul(ones({4}), ones({3})); }), "expected b to be 4 (a's last dimension), found 3");
  has(error_message([] { matmul(ones({2, 3, 4}), ones({3, 4, 5})); }), "[2] and [3] cannot be broadcast together");
  has(error_message([] { addmm(ones({3}), ones({2, 3}), ones({3, 4})); }),
      "addmm: shapes [3] and [2, 4] cannot be broadcast together (dimension 1: 3 vs 4)");
  has(error_message([] { addmm(ones({2, 2, 4}), ones({2, 3}), ones({3, 4})); }),
      "addmm: expected input broadcastable to the product's shape [2, 4], found [cpu f32 [2, 2, 4]]");
  has(error_message([] { addmm(ones({4}), ones({2, 3}), ones({2, 4})); }),
      "addmm: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x4)");
  has(error_message([] { addmm(ones({4}, kFloat64), ones({2, 3}), ones({3, 4})); }), "same dtype");
}

TEST_CASE("matmul: MmBackward saves only what a gradient needs") {
  // y = x W with only W requiring grad: dW = x^T dy needs x, nothing needs W.
  Tensor x = ones({2, 3});
  Tensor W = ones({3, 4}).requires_grad_();
  Tensor y = mm(x, W);
  {
    NoGradGuard no_grad;
    W.mul_(2.0);  // an optimizer step before backward: fine, W is not saved
  }
  y.sum().backward();
  nd::testing::check_close(W.grad(), std::vector<double>(12, 2.0), 0, 0, "dW = x^T 1");
  // Changing x (saved for dW) is caught by its version counter.
  Tensor y2 = mm(x, W);
  x.add_(1.0);
  const std::string msg = nd::testing::error_message([&] { y2.sum().backward(); });
  CHECK_MESSAGE(msg.find("saved by MmBackward") != std::string::npos, msg);
}

// A transposed operand (linear's weight.t()) gets its gradient computed in its own layout,
// so the weight's gradient arrives contiguous and AccumulateGrad keeps it without a copy.
// autograd::grad returns the gradient as the graph produced it (no AccumulateGrad copy).
TEST_CASE("matmul: the gradient of a transposed operand comes back contiguous, with the right values") {
  const Tensor x = nd::testing::random_input({5, 3}, 21);
  const Tensor W = nd::testing::random_input({4, 3}, 22).requires_grad_();  // [out, in], as Linear's
  const Tensor b = nd::testing::random_input({4}, 23).requires_grad_();
  const Tensor g = nd::testing::random_input({5, 4}, 24);
  const Tensor dW = autograd::grad({(addmm(b, x, W.t()) * g).sum()}, {W})[0];
  CHECK(dW.is_contiguous());
  nd::testing::check_close(dW, mm(g.t(), x), 1e-6, 1e-6, "dW = g^T x");
  // The other side: mm(A.t(), B) with A contiguous gives A's gradient contiguous too.
  const Tensor A = nd::testing::random_input({5, 3}, 25).requires_grad_();
  const Tensor B = nd::testing::random_input({5, 4}, 26);
  const Tensor h = nd::testing::random_input({3, 4}, 27);
  const Tensor dA = autograd::grad({(mm(A.t(), B) * h).sum()}, {A})[0];
  CHECK(dA.is_contiguous());
  nd::testing::check_close(dA, mm(B, h.t()), 1e-6, 1e-6, "dA = B h^T");
}
