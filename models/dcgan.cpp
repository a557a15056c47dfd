#include "models/dcgan.h"

namespace nd::models {

namespace {
nn::LeakyReLU leaky_relu_02() { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)); }
}  // namespace

DCGANGeneratorImpl::DCGANGeneratorImpl(int64_t nz_, int64_t ngf_) : nn::Module("DCGANGenerator"), nz(nz_), ngf(ngf_) {
  ND_CHECK(nz > 0 && ngf > 0, "DCGANGenerator: nz and ngf must be positive, got nz=", nz, ", ngf=", ngf);
  using Opt = nn::ConvTranspose2dOptions;
  main = register_module(
      "main", nn::Sequential(nn::ConvTranspose2d(Opt(nz, ngf * 2, 7).bias(false)), nn::BatchNorm2d(ngf * 2), nn::ReLU(),
                             nn::ConvTranspose2d(Opt(ngf * 2, ngf, 4).stride(2).padding(1).bias(false)),
                             nn::BatchNorm2d(ngf), nn::ReLU(),
                             nn::ConvTranspose2d(Opt(ngf, 1, 4).stride(2).padding(1).bias(false)), nn::Tanh()));
}

Tensor DCGANGeneratorImpl::forward(const Tensor& z) {
  const bool flat = z.dim() == 2 && z.size(1) == nz;
  const bool spatial = z.dim() == 4 && z.size(1) == nz && z.size(2) == 1 && z.size(3) == 1;
  ND_CHECK(flat || spatial, "DCGANGenerator: expected z of shape [N, ", nz, "] or [N, ", nz, ", 1, 1], found ",
           z.describe());
  return main->forward(z.reshape({z.size(0), nz, 1, 1}));
}

DCGANDiscriminatorImpl::DCGANDiscriminatorImpl(int64_t ndf_) : nn::Module("DCGANDiscriminator"), ndf(ndf_) {
  ND_CHECK(ndf > 0, "DCGANDiscriminator: ndf must be positive, got ", ndf);
  using Opt = nn::Conv2dOptions;
  main = register_module("main", nn::Sequential(nn::Conv2d(Opt(1, ndf, 4).stride(2).padding(1).bias(false)),
                                                leaky_relu_02(),
                                                nn::Conv2d(Opt(ndf, ndf * 2, 4).stride(2).padding(1).bias(false)),
                                                nn::BatchNorm2d(ndf * 2), leaky_relu_02(),
                                                nn::Conv2d(Opt(ndf * 2, 1, 7).bias(false))));
}

Tensor DCGANDiscriminatorImpl::forward(const Tensor& images) {
  ND_CHECK(images.dim() == 4 && images.size(1) == 1 && images.size(2) == 28 && images.size(3) == 28,
           "DCGANDiscriminator: expected images of shape [N, 1, 28, 28], found ", images.describe());
  return main->forward(images).reshape({images.size(0)});
}

void dcgan_init(nn::Module& module) {
  module.apply([](nn::Module& m) {
    if (auto* conv = dynamic_cast<nn::Conv2dImpl*>(&m)) {
      nn::init::normal_(conv->weight, 0.0, 0.02);
    } else if (auto* convt = dynamic_cast<nn::ConvTranspose2dImpl*>(&m)) {
      nn::init::normal_(convt->weight, 0.0, 0.02);
    } else if (auto* bn = dynamic_cast<nn::BatchNormBase*>(&m); bn && bn->options.affine()) {
      nn::init::normal_(bn->weight, 1.0, 0.02);
      nn::init::zeros_(bn->bias);
    }
  });
}

}  // namespace nd::models
