#pragma once
// DCGAN (Radford et al. 2015) as PyTorch's examples/dcgan builds it, at three sizes:
// "dcgan64" is that example exactly (64x64 RGB, nz 100, ngf = ndf = 64), "dcgan32" the
// same stack one stage shorter (32x32 RGB), "dcgan28" the 28x28 single-channel CPU
// default (a 7x7 first map, 7 -> 14 -> 28). Parameter names are those of the example's
// nn.Sequential ("main.0.weight", "main.1.running_mean", ...); the discriminator ends in
// a logit (the example's Sigmoid, which has no parameters, is left to the loss).
// Tests: tests/models/dcgan_test.cpp, tests/models/golden_models_test.cpp,
// tests/models/golden_dcgan_test.cpp.
#include <string>

#include "engine/nn/nn.h"
#include "engine/tensor.h"

namespace nd::models {

// The generator doubles the side `upsamplings()` times from a base() x base() map; the
// discriminator halves it as many times back to base() and reads one logit there.
struct DCGANConfig {
  int64_t image_size = 28;  // base * 2^k, base 4 or 7, k >= 1
  int64_t nc = 1;           // image channels
  int64_t nz = 64;          // latent size
  int64_t ngf = 32, ndf = 32;

  // 28x28x1, nz 64, ngf = ndf = 32: train_gan's CPU default.
  static DCGANConfig dcgan28();
  // 32x32x3, nz 100, ngf = ndf = 64: dcgan64 without its widest stage.
  static DCGANConfig dcgan32();
  // 64x64x3, nz 100, ngf = ndf = 64: PyTorch's examples/dcgan.
  static DCGANConfig dcgan64();
  // "dcgan28", "dcgan32" or "dcgan64"; anything else throws, naming the three.
  static DCGANConfig by_name(const std::string& name);

  // 7 when image_size is 7 * 2^k, else 4; throws unless image_size = base * 2^k, k >= 1.
  int64_t base() const;
  // k: the stride-2 layers of each network.
  int64_t upsamplings() const;
};

// z [N, nz] (or [N, nz, 1, 1]) -> images [N, nc, S, S] in (-1, 1), S = image_size,
// k = upsamplings(), w_i = ngf * 2^(k-1-i):
//   main.0 ConvTranspose2d(nz, w_0, base, 1, 0), main.1 BN, main.2 ReLU    -> [N, w_0, base, base]
//   then for i = 1 .. k-1: ConvTranspose2d(w_{i-1}, w_i, 4, 2, 1), BN, ReLU (side doubles)
//   last: ConvTranspose2d(ngf, nc, 4, 2, 1), Tanh                          -> [N, nc, S, S]
// dcgan64: main.0 (100 -> 512, 4x4), main.3 (-> 256), main.6 (-> 128), main.9 (-> 64),
// main.12 (-> 3, 64x64), main.13 Tanh. Convolutions have no bias (BatchNorm follows).
// Weights are PyTorch's defaults until dcgan_init is applied.
class DCGANGeneratorImpl : public nn::Module {
 public:
  explicit DCGANGeneratorImpl(const DCGANConfig& config = DCGANConfig::dcgan28());
  // dcgan28 with these widths (the apps' --nz and --ngf).
  DCGANGeneratorImpl(int64_t nz, int64_t ngf);
  Tensor forward(const Tensor& z) override;

  DCGANConfig config;
  nn::Sequential main{nullptr};
};
ND_MODULE(DCGANGenerator);

// images [N, nc, S, S] -> one logit per image [N]:
//   main.0 Conv2d(nc, ndf, 4, 2, 1), main.1 LeakyReLU(0.2)
//   then for i = 1 .. k-1: Conv2d(ndf 2^(i-1), ndf 2^i, 4, 2, 1), BN, LeakyReLU(0.2)
//   last: Conv2d(ndf 2^(k-1), 1, base, 1, 0) -> [N, 1, 1, 1] -> view [N]
// dcgan64: main.0, main.2 + main.3 (BN), main.5 + main.6, main.8 + main.9, main.11
// (512 -> 1, 4x4): the example's keys; its main.12 Sigmoid is sigmoid(logit).
class DCGANDiscriminatorImpl : public nn::Module {
 public:
  explicit DCGANDiscriminatorImpl(const DCGANConfig& config = DCGANConfig::dcgan28());
  // dcgan28 with this width (the apps' --ndf).
  explicit DCGANDiscriminatorImpl(int64_t ndf);
  Tensor forward(const Tensor& images) override;

  DCGANConfig config;
  nn::Sequential main{nullptr};
};
ND_MODULE(DCGANDiscriminator);

// The DCGAN paper's init (PyTorch example's weights_init), over every submodule:
// Conv2d / ConvTranspose2d weight N(0, 0.02^2); BatchNorm2d weight N(1, 0.02^2), bias 0.
// BatchNorm2d and SyncBatchNorm alike (it may run before or after convert_sync_batchnorm).
void dcgan_init(nn::Module& module);

}  // namespace nd::models
