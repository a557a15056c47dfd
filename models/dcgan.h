#pragma once
// DCGAN for 28x28 single-channel images (Radford et al. 2015; PyTorch's DCGAN example
// with the 64x64 stack cut to 7 -> 14 -> 28). Parameter names are those of the same
// nn.Sequential tree in PyTorch ("main.0.weight", "main.1.running_mean", ...).
// Tests: tests/models/dcgan_test.cpp, tests/models/golden_models_test.cpp.
#include <nanoddp.h>

namespace nd::models {

// z [N, nz] (or [N, nz, 1, 1]) -> images [N, 1, 28, 28] in (-1, 1):
//   main.0 ConvTranspose2d(nz, 2 ngf, 7, 1, 0)  -> [N, 2 ngf, 7, 7],  main.1 BN, main.2 ReLU
//   main.3 ConvTranspose2d(2 ngf, ngf, 4, 2, 1) -> [N, ngf, 14, 14],  main.4 BN, main.5 ReLU
//   main.6 ConvTranspose2d(ngf, 1, 4, 2, 1)     -> [N, 1, 28, 28],    main.7 Tanh
// Convolutions have no bias (BatchNorm follows). Weights are PyTorch's defaults until
// dcgan_init is applied.
class DCGANGeneratorImpl : public nn::Module {
 public:
  explicit DCGANGeneratorImpl(int64_t nz = 100, int64_t ngf = 64);
  Tensor forward(const Tensor& z) override;

  int64_t nz, ngf;
  nn::Sequential main{nullptr};
};
ND_MODULE(DCGANGenerator);

// images [N, 1, 28, 28] -> one logit per image [N]:
//   main.0 Conv2d(1, ndf, 4, 2, 1)        -> [N, ndf, 14, 14],   main.1 LeakyReLU(0.2)
//   main.2 Conv2d(ndf, 2 ndf, 4, 2, 1)    -> [N, 2 ndf, 7, 7],   main.3 BN, main.4 LeakyReLU(0.2)
//   main.5 Conv2d(2 ndf, 1, 7, 1, 0)      -> [N, 1, 1, 1] -> view [N]
class DCGANDiscriminatorImpl : public nn::Module {
 public:
  explicit DCGANDiscriminatorImpl(int64_t ndf = 64);
  Tensor forward(const Tensor& images) override;

  int64_t ndf;
  nn::Sequential main{nullptr};
};
ND_MODULE(DCGANDiscriminator);

// The DCGAN paper's init (PyTorch example's weights_init), over every submodule:
// Conv2d / ConvTranspose2d weight N(0, 0.02^2); BatchNorm2d weight N(1, 0.02^2), bias 0.
// BatchNorm2d and SyncBatchNorm alike (it may run before or after convert_sync_batchnorm).
void dcgan_init(nn::Module& module);

}  // namespace nd::models
