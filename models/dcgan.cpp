#include "models/dcgan.h"
#include "engine/error.h"
#include "engine/ops/elementwise.h"

namespace nd::models {

namespace {
nn::LeakyReLU leaky_relu_02() { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)); }

DCGANConfig widths(int64_t nz, int64_t ngf, int64_t ndf) {
  DCGANConfig c;
  c.nz = nz, c.ngf = ngf, c.ndf = ndf;
  return c;
}

// Appends layers in order: each is built (and draws its default init) before the next.
template <class... Layers>
void append(nn::Sequential& seq, Layers&&... layers) {
  (seq->push_back(std::forward<Layers>(layers)), ...);
}

// The config's checks, once for both networks.
const DCGANConfig& checked(const DCGANConfig& c, const char* who) {
  ND_CHECK(c.nz > 0 && c.ngf > 0 && c.ndf > 0 && c.nc > 0, who, ": nz, ngf, ndf and nc must be positive, got nz=", c.nz,
           ", ngf=", c.ngf, ", ndf=", c.ndf, ", nc=", c.nc);
  (void)c.upsamplings();  // throws for an image_size the stack cannot reach
  return c;
}
}  // namespace

DCGANConfig DCGANConfig::dcgan28() { return DCGANConfig{}; }

DCGANConfig DCGANConfig::dcgan32() {
  DCGANConfig c = widths(100, 64, 64);
  c.image_size = 32, c.nc = 3;
  return c;
}

DCGANConfig DCGANConfig::dcgan64() {
  DCGANConfig c = widths(100, 64, 64);
  c.image_size = 64, c.nc = 3;
  return c;
}

DCGANConfig DCGANConfig::by_name(const std::string& name) {
  if (name == "dcgan28") return dcgan28();
  if (name == "dcgan32") return dcgan32();
  if (name == "dcgan64") return dcgan64();
  throw Error("DCGANConfig: unknown configuration '" + name + "' (expected dcgan28, dcgan32 or dcgan64)");
}

int64_t DCGANConfig::base() const {
  int64_t side = image_size;
  while (side > 7 && side % 2 == 0) side /= 2;
  if (side == 7 && image_size > 7) return 7;
  return 4;
}

int64_t DCGANConfig::upsamplings() const {
  const int64_t b = base();
  int64_t k = 0, side = b;
  while (side < image_size) side *= 2, ++k;
  ND_CHECK(k >= 1 && side == image_size, "DCGANConfig: image_size must be 4 * 2^k or 7 * 2^k with k >= 1 (28, 32, "
           "64, ...), got ", image_size);
  return k;
}

DCGANGeneratorImpl::DCGANGeneratorImpl(const DCGANConfig& c)
    : nn::Module("DCGANGenerator"), config(checked(c, "DCGANGenerator")) {
  using Opt = nn::ConvTranspose2dOptions;
  const int64_t k = c.upsamplings();
  int64_t width = c.ngf << (k - 1);
  nn::Sequential layers(nn::ConvTranspose2d(Opt(c.nz, width, c.base()).bias(false)), nn::BatchNorm2d(width),
                        nn::ReLU());
  for (; width > c.ngf; width /= 2)
    append(layers, nn::ConvTranspose2d(Opt(width, width / 2, 4).stride(2).padding(1).bias(false)),
           nn::BatchNorm2d(width / 2), nn::ReLU());
  append(layers, nn::ConvTranspose2d(Opt(c.ngf, c.nc, 4).stride(2).padding(1).bias(false)), nn::Tanh());
  main = register_module("main", layers);
}

DCGANGeneratorImpl::DCGANGeneratorImpl(int64_t nz, int64_t ngf)
    : DCGANGeneratorImpl(widths(nz, ngf, DCGANConfig{}.ndf)) {}

Tensor DCGANGeneratorImpl::forward(const Tensor& z) {
  const int64_t nz = config.nz;
  const bool flat = z.dim() == 2 && z.size(1) == nz;
  const bool spatial = z.dim() == 4 && z.size(1) == nz && z.size(2) == 1 && z.size(3) == 1;
  ND_CHECK(flat || spatial, "DCGANGenerator: expected z of shape [N, ", nz, "] or [N, ", nz, ", 1, 1], found ",
           z.describe());
  return main->forward(z.reshape({z.size(0), nz, 1, 1}));
}

DCGANDiscriminatorImpl::DCGANDiscriminatorImpl(const DCGANConfig& c)
    : nn::Module("DCGANDiscriminator"), config(checked(c, "DCGANDiscriminator")) {
  using Opt = nn::Conv2dOptions;
  const int64_t top = c.ndf << (c.upsamplings() - 1);
  nn::Sequential layers(nn::Conv2d(Opt(c.nc, c.ndf, 4).stride(2).padding(1).bias(false)), leaky_relu_02());
  for (int64_t width = c.ndf; width < top; width *= 2)
    append(layers, nn::Conv2d(Opt(width, width * 2, 4).stride(2).padding(1).bias(false)), nn::BatchNorm2d(width * 2),
           leaky_relu_02());
  layers->push_back(nn::Conv2d(Opt(top, 1, c.base()).bias(false)));
  main = register_module("main", layers);
}

DCGANDiscriminatorImpl::DCGANDiscriminatorImpl(int64_t ndf)
    : DCGANDiscriminatorImpl(widths(DCGANConfig{}.nz, DCGANConfig{}.ngf, ndf)) {}

Tensor DCGANDiscriminatorImpl::forward(const Tensor& images) {
  const int64_t s = config.image_size;
  ND_CHECK(images.dim() == 4 && images.size(1) == config.nc && images.size(2) == s && images.size(3) == s,
           "DCGANDiscriminator: expected images of shape [N, ", config.nc, ", ", s, ", ", s, "], found ",
           images.describe());
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
