#pragma once
// The activation a batch norm may apply to its own output (nd::batch_norm's `activation`):
// none, ReLU or LeakyReLU with a slope >= 0, so that BatchNorm2d followed by ReLU or
// LeakyReLU is one pass forward and its backward takes the activation's gradient as it
// loads dy. The value and the derivative are elementwise_math.h's, so the fused op rounds
// bit for bit as the unfused pair. The derivative is taken from the output y: with a slope
// >= 0, y > 0 exactly where the pre-activation is > 0 (NaN maps to a y that is not > 0,
// as its pre-activation), so the pre-activation need not be kept.
#include "kernels/common/elementwise_math.h"
#include "kernels/common/host_device.h"

namespace nd::kernels {

struct BatchNormActivation {
  enum class Kind : uint8_t { none, relu, leaky_relu };
  Kind kind = Kind::none;
  double negative_slope = 0;  // leaky_relu's, >= 0

  ND_HOST_DEVICE bool on() const { return kind != Kind::none; }
  // y = act(v).
  template <class T>
  ND_HOST_DEVICE T forward(T v) const {
    if (kind == Kind::none) return v;
    return math::apply_unary(op(), {negative_slope, 0}, v);
  }
  // The gradient at the activation's input, given dy at its output y.
  template <class T>
  ND_HOST_DEVICE T backward(T dy, T y) const {
    if (kind == Kind::none) return dy;
    return dy * math::derivative(op(), {negative_slope, 0}, y, y);
  }

 private:
  ND_HOST_DEVICE UnaryOp op() const { return kind == Kind::relu ? UnaryOp::relu : UnaryOp::leaky_relu; }
};

}  // namespace nd::kernels
