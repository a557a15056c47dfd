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

nd::models::DCGANConfig dcgan_config(const std::string& name, const ImageShape& data) {
  if (name.empty()) {
    // dcgan28, dcgan32 or dcgan64 by image size; another size keeps dcgan28's widths.
    const bool named = data.size == 28 || data.size == 32 || data.size == 64;
    nd::models::DCGANConfig c = nd::models::DCGANConfig::by_name(named ? "dcgan" + std::to_string(data.size) : "dcgan28");
    c.image_size = data.size;
    c.nc = data.channels;
    try {
      (void)c.upsamplings();
    } catch (const nd::Error& e) {
      throw UsageError{"--image-size " + std::to_string(data.size) + ": " + e.what()};
    }
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
    // 224x224: the ViT-B; other sizes: tiny (cpu) or small (cuda) at the data's size.
    const bool vit_b = allow_vit && data.size == 224;
    nd::models::MAEConfig c = nd::models::MAEConfig::by_name(
        vit_b ? std::string(vits[0]) : std::string(device.is_cpu() ? "tiny" : "small"));
    c.img_size = data.size;
    c.in_chans = data.channels;
    if (c.img_size % c.patch_size != 0)
      throw UsageError{"--image-size " + std::to_string(c.img_size) + " is not a multiple of the MAE's patch size " +
                       std::to_string(c.patch_size)};
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
