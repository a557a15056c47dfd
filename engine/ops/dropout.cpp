#include "engine/ops/dropout.h"

#include "engine/ops/common.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cuda/dropout.h"

namespace nd {

namespace {

struct NativeDropoutBackward : autograd::Node {
  double p = 0;
  uint64_t seed = 0, offset = 0;
  std::string name() const override { return "NativeDropoutBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor g = grads[0].contiguous();
    Tensor dx = empty_like(g);
    ops::dispatch_floating("dropout backward", g, [&]<class T>() {
      const T* gp = g.data_ptr<T>();
      T* dxp = dx.data_ptr<T>();
      ops::on_device(
          g, [&] { kernels::cpu::dropout_backward<T>(gp, g.numel(), p, seed, offset, dxp); },
          [&](auto stream) { kernels::cuda::dropout_backward<T>(gp, g.numel(), p, seed, offset, dxp, stream); });
    });
    return {dx};
  }
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  const char* op = "dropout";
  ND_CHECK(p >= 0.0 && p <= 1.0, op, ": dropout probability has to be between 0 and 1, but got ", p);
  ops::dispatch_floating(op, x, []<class T>() {});
  if (!training || p == 0.0) return x;
  const Tensor xd = x.detach().contiguous();
  Generator& gen = default_generator();
  const uint64_t seed = gen.seed, offset = gen.offset;
  gen.offset += static_cast<uint64_t>(xd.numel());
  Tensor y = empty_like(xd);
  ops::dispatch_floating(op, x, [&]<class T>() {
    const T* xp = xd.data_ptr<T>();
    T* yp = y.data_ptr<T>();
    ops::on_device(
        xd, [&] { kernels::cpu::dropout_forward<T>(xp, xd.numel(), p, seed, offset, yp); },
        [&](auto stream) { kernels::cuda::dropout_forward<T>(xp, xd.numel(), p, seed, offset, yp, stream); });
  });
  autograd::record<NativeDropoutBackward>({x}, {y}, [&](NativeDropoutBackward& n) {
    n.p = p;
    n.seed = seed;
    n.offset = offset;
  });
  return y;
}

}  // namespace nd
