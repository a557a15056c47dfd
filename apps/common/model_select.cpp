#include "common/model_select.h"

#include <algorithm>

#include "common/flags.h"

namespace app {

namespace {

std::string images_of(int64_t size, int64_t channels) { return ImageShape{channels, size}.str(); }

void check_matches(const std::string& name, int64_t size, int64_t channels, const ImageShape& data) {
  ND_CHECK(size == data.size && channels == data.channels, "--model ", name, " takes ", images_of(size, channels),
           " images; the data's are ", data.str(), " (pass a --model for ", data.str(),
           " images, or leave --model out to follow the data)");
}

}  // namespace

std::string ImageShape::str() const {
  return std::to_string(size) + "x" + std::to_string(size) + "x" + std::to_string(channels);
}

ImageShape image_shape(const nd::Tensor& images) {
  ND_CHECK(images.dim() == 4 && images.size(2) == images.size(3), "expected training images [N, C, S, S], found ",
           images.describe());
  return {images.size(1), images.size(2)};
}

nd::models::DCGANConfig dcgan_config(const std::string& name, const ImageShape& data) {
  if (name.empty()) {
    ND_CHECK(data.size == 28 || data.size == 32 || data.size == 64, "no DCGAN config for ", data.str(),
             " images: the configs take 28x28 (dcgan28), 32x32 (dcgan32) or 64x64 (dcgan64)");
    nd::models::DCGANConfig c = nd::models::DCGANConfig::by_name("dcgan" + std::to_string(data.size));
    c.nc = data.channels;
    return c;
  }
  nd::models::DCGANConfig c;
  try {
    c = nd::models::DCGANConfig::by_name(name);
  } catch (const nd::Error&) {
    throw UsageError{"--model expects dcgan28, dcgan32 or dcgan64, got '" + name + "'"};
  }
  check_matches(name, c.image_size, c.nc, data);
  return c;
}

nd::models::MAEConfig mae_config(const std::string& name, const ImageShape& data, const nd::Device& device,
                                 bool allow_vit) {
  const char* vits[] = {"mae_vit_base_patch16_dec512d8b", "mae_vit_large_patch16_dec512d8b",
                        "mae_vit_huge_patch14_dec512d8b"};
  if (name.empty()) {
    ND_CHECK(data.size == 28 || (allow_vit && data.size == 224), "no MAE config for ", data.str(),
             " images: the configs take 28x28 (tiny, small)", allow_vit ? " or 224x224 (the ViTs)" : "");
    nd::models::MAEConfig c = nd::models::MAEConfig::by_name(
        data.size == 224 ? std::string(vits[0]) : std::string(device.is_cpu() ? "tiny" : "small"));
    c.in_chans = data.channels;
    return c;
  }
  const bool vit = std::find(std::begin(vits), std::end(vits), name) != std::end(vits);
  if (vit && !allow_vit)
    throw UsageError{"--model " + name + ": train_joint's MAE reconstructs its DCGAN's 28x28 images; expected tiny "
                     "or small"};
  nd::models::MAEConfig c;
  try {
    c = nd::models::MAEConfig::by_name(name);
  } catch (const nd::Error&) {
    const std::string expected = allow_vit ? "tiny, small, mae_vit_base_patch16_dec512d8b, "
                                             "mae_vit_large_patch16_dec512d8b or mae_vit_huge_patch14_dec512d8b"
                                           : "tiny or small";
    throw UsageError{"--model expects " + expected + ", got '" + name + "'"};
  }
  check_matches(name, c.img_size, c.in_chans, data);
  return c;
}

std::string init_mae_from(nd::models::MAEImpl& mae, const std::string& path) {
  const nd::TensorDict state = nd::load(path);
  const bool has_decoder = std::any_of(state.begin(), state.end(), [](const auto& kv) {
    return nd::models::MAEEncoderImpl::is_decoder_key(kv.first);
  });
  try {
    if (has_decoder) {
      mae.load_state_dict(state, /*strict=*/true);
      return "encoder and decoder from " + path;
    }
    mae.load_encoder_state_dict(state);
    return "encoder from " + path + " (no decoder keys: the decoder keeps its init)";
  } catch (const nd::Error& e) {
    throw nd::Error("--init-from " + path + ": " + e.what());
  }
}

}  // namespace app
