// conv2d and conv_transpose2d through the engine: gradcheck table (f64; stride,
// padding, dilation, groups, no bias, unbatched, batch size 1, non-contiguous),
// known values, argument errors, and ConvolutionBackward's saved-tensor checks.
#include "engine/ops/conv.h"

#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("conv: gradcheck table (f64, non-contiguous)") {
  using V = std::vector<Tensor>;
  const std::vector<OpCase> cases = {
      {"conv2d 3x3 pad 1", {{2, 3, 5, 5}, {4, 3, 3, 3}, {4}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {1}, {1}); }},
      {"conv2d k4 s2 p1 (DCGAN)", {{2, 2, 6, 6}, {3, 2, 4, 4}, {3}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {2}, {1}); }},
      {"conv2d stride/pad/dilation per dim", {{1, 2, 7, 6}, {2, 2, 3, 2}, {2}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {2, 1}, {1, 0}, {2, 1}); }},
      {"conv2d groups 2", {{2, 4, 5, 5}, {6, 2, 3, 3}, {6}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {1}, {1}, {1}, 2); }},
      {"conv2d depthwise, no bias", {{1, 3, 4, 5}, {3, 1, 2, 2}},
       [](const V& x) { return conv2d(x[0], x[1], {}, {1}, {0}, {1}, 3); }},
      {"conv2d 1x1", {{3, 4, 3, 2}, {2, 4, 1, 1}, {2}}, [](const V& x) { return conv2d(x[0], x[1], x[2]); }},
      {"conv2d unbatched", {{2, 5, 5}, {3, 2, 3, 3}, {3}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {2}, {1}); }},
      {"conv_transpose2d k4 s2 p1 (DCGAN)", {{2, 3, 3, 3}, {3, 2, 4, 4}, {2}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {2}, {1}); }},
      {"conv_transpose2d output_padding, groups", {{1, 4, 3, 3}, {4, 1, 3, 3}, {2}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {2}, {1}, {1}, 2); }},
      {"conv_transpose2d dilation, no bias", {{2, 2, 3, 3}, {2, 3, 2, 2}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], {}, {1}, {0}, {0}, 1, {2}); }},
      {"conv_transpose2d unbatched, asymmetric", {{2, 3, 2}, {2, 2, 2, 3}, {2}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {2, 1}, {0, 1}, {1, 0}); }},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
  // Gradients only for the input (weight is a constant, e.g. a frozen feature net).
  nd::testing::run_gradcheck({"conv2d input only", {{1, 2, 4, 4}, {3, 2, 3, 3}},
                              [](const V& x) { return conv2d(x[0], x[1], {}, {1}, {1}); }, -1, 1, {true, false}});
}

TEST_CASE("conv: known values worked by hand") {
  // 3x3 image 1..9, 2x2 kernel of ones, bias 0.5: each output is a 2x2 window sum + 0.5.
  Tensor x = arange(1, 10, 1, kFloat64).reshape({1, 1, 3, 3}).requires_grad_();
  Tensor w = ones({1, 1, 2, 2}, kFloat64).requires_grad_();
  Tensor b = tensor({0.5}, kFloat64).requires_grad_();
  Tensor y = conv2d(x, w, b);
  nd::testing::check_close(y, {12.5, 16.5, 24.5, 28.5}, 0, 0, "conv2d");
  CHECK(y.grad_fn()->name() == "ConvolutionBackward");
  y.sum().backward();
  // dx counts the windows covering each pixel; dw[i,j] sums the 2x2 sub-image at (i, j); db counts outputs.
  nd::testing::check_close(x.grad(), {1, 2, 1, 2, 4, 2, 1, 2, 1}, 0, 0, "dx");
  nd::testing::check_close(w.grad(), {12, 16, 24, 28}, 0, 0, "dw");
  nd::testing::check_close(b.grad(), {4}, 0, 0, "db");

  // Transposed, stride 2, 2x2 ones: every pixel becomes a 2x2 block; output_padding adds
  // a last row and column that only the bias reaches.
  Tensor t = conv_transpose2d(tensor({1, 2, 3, 4}).reshape({1, 1, 2, 2}), ones({1, 1, 2, 2}), tensor({1}), {2}, {0},
                              {1});
  CHECK(t.sizes() == Shape{1, 1, 5, 5});
  nd::testing::check_close(t, {2, 2, 3, 3, 1, 2, 2, 3, 3, 1, 4, 4, 5, 5, 1, 4, 4, 5, 5, 1, 1, 1, 1, 1, 1}, 0, 0,
                           "conv_transpose2d");
  // DCGAN shapes: 7x7 -> 14x14 -> 28x28, and 28 -> 14 -> 7 back down.
  CHECK(conv_transpose2d(ones({2, 8, 7, 7}), ones({8, 4, 4, 4}), {}, {2}, {1}).sizes() == Shape{2, 4, 14, 14});
  CHECK(conv2d(ones({2, 1, 28, 28}), ones({4, 1, 4, 4}), {}, {2}, {1}).sizes() == Shape{2, 4, 14, 14});
  CHECK(conv2d(ones({0, 2, 5, 5}), ones({3, 2, 3, 3})).sizes() == Shape{0, 3, 3, 3});  // empty batch
}

TEST_CASE("conv: argument errors name what was expected and found") {
  using nd::testing::error_message;
  auto has = [](const std::string& msg, const std::string& part) {
    CHECK_MESSAGE(msg.find(part) != std::string::npos, "message: ", msg);
  };
  has(error_message([] { conv2d(ones({64, 1, 28, 28}), ones({64, 3, 4, 4})); }),
      "conv2d: given groups=1 and weight [cpu f32 [64, 3, 4, 4]], expected input with 3 channels (weight.size(1) * "
      "groups), found 1 channels in [cpu f32 [64, 1, 28, 28]]");
  has(error_message([] { conv2d(ones({1, 4, 5, 5}), ones({6, 1, 3, 3}), {}, {1}, {0}, {1}, 4); }),
      "expected weight's output channels (size(0) = 6) to be divisible by groups=4");
  has(error_message([] { conv2d(ones({1, 2, 5, 5}), ones({4, 2, 3, 3}), ones({3})); }),
      "conv2d: expected bias of shape [4] (one value per output channel), found [cpu f32 [3]]");
  has(error_message([] { conv2d(ones({1, 1, 2, 2}), ones({1, 1, 4, 4})); }),
      "is larger than the padded input (2x2, padding 0x0) of [cpu f32 [1, 1, 2, 2]]");
  has(error_message([] { conv2d(ones({1, 1, 5, 5}), ones({1, 1, 3, 3}), {}, {0}); }),
      "conv2d: expected stride >= 1, found (0, 0)");
  has(error_message([] { conv2d(ones({1, 1, 5, 5}), ones({1, 1, 3, 3}), {}, {1}, {1, 1, 1}); }),
      "expected padding as one value or two ({h, w}), found 3 values");
  has(error_message([] { conv2d(ones({5, 5}), ones({1, 1, 3, 3})); }),
      "conv2d: expected a 3-D (unbatched [C_in, H, W]) or 4-D ([N, C_in, H, W]) input, found [cpu f32 [5, 5]]");
  has(error_message([] { conv2d(ones({1, 1, 5, 5}), ones({1, 1, 3})); }),
      "expected a 4-D tensor (weight [C_out, C_in/groups, kH, kW]), found [cpu f32 [1, 1, 3]]");
  has(error_message([] { conv2d(ones({1, 1, 5, 5}), ones({1, 1, 3, 3}, kFloat64)); }), "same dtype");
  has(error_message([] { conv_transpose2d(ones({1, 3, 4, 4}), ones({5, 2, 3, 3})); }),
      "so expected input with 5 channels, found 3 channels in [cpu f32 [1, 3, 4, 4]]");
  has(error_message([] { conv_transpose2d(ones({1, 2, 4, 4}), ones({2, 2, 3, 3}), {}, {2}, {1}, {2}); }),
      "output_padding must be smaller than either stride or dilation, found output_padding 2x2, stride 2x2, "
      "dilation 1x1");
  has(error_message([] { conv_transpose2d(ones({1, 2, 1, 1}), ones({2, 2, 1, 1}), {}, {1}, {1}); }),
      "conv_transpose2d: the output size -1x-1 computed for input [cpu f32 [1, 2, 1, 1]] is too small");
}

TEST_CASE("conv: ConvolutionBackward's saved weight is version-checked") {
  Tensor x = ones({1, 1, 4, 4}).requires_grad_();
  Tensor w = ones({2, 1, 3, 3}).requires_grad_();
  w.set_name("D.main.0.weight");
  Tensor y = conv2d(x, w, {}, {1}, {1});
  {
    NoGradGuard no_grad;
    w.sub_(ones({2, 1, 3, 3}), 0.1);  // an optimizer step between forward and backward
  }
  const std::string msg = nd::testing::error_message([&] { y.sum().backward(); });
  CHECK_MESSAGE(msg.find("[cpu f32 [2, 1, 3, 3]] 'D.main.0.weight', saved by ConvolutionBackward, is at version 1; "
                         "expected version 0") != std::string::npos,
                msg);
  // Input-only gradients do not save the input, so changing it is not an error.
  Tensor x2 = ones({1, 1, 4, 4}).requires_grad_();
  Tensor frozen = ones({2, 1, 3, 3});
  Tensor y2 = conv2d(x2, frozen, {}, {1}, {1});
  {
    NoGradGuard no_grad;
    x2.mul_(3.0);
  }
  y2.sum().backward();
  CHECK(x2.grad().defined());
}
