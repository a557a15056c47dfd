#pragma once
// The apps' --model and --init-from: which models::DCGANConfig or models::MAEConfig a run
// builds, and the weights it starts from. The data decides the image size and channels:
// without --model the config follows them; a --model whose images differ from the data's
// is an nd::Error naming both; an unknown name is a UsageError listing the names.
#include <string>

#include <nanoddp.h>

namespace app {

// The training images' [C, H, W] as the configs take them (square images).
struct ImageShape {
  int64_t channels = 1, size = 28;
  std::string str() const;  // "28x28x1"
};

// name "": dcgan28 for 28x28, dcgan32 for 32x32, dcgan64 for 64x64 images, another size with
// dcgan28's widths (a size the generator cannot reach by doublings is a UsageError), with
// the data's channels. name: DCGANConfig::by_name(name), which must take the data's images.
nd::models::DCGANConfig dcgan_config(const std::string& name, const ImageShape& data);

// name "": mae_vit_base_patch16_dec512d8b for 224x224 images, otherwise tiny (cpu) or small
// (cuda) at the data's size (a multiple of the patch size, else a UsageError), with the
// data's channels. name:
// MAEConfig::by_name(name), which must take the data's images. allow_vit false (train_joint,
// whose MAE reconstructs its DCGAN's 28x28 images): the three ViT names are a UsageError.
nd::models::MAEConfig mae_config(const std::string& name, const ImageShape& data, const nd::Device& device,
                                 bool allow_vit = true);

// --init-from FILE: a safetensors file of an MAE's weights (models/mae_pth_to_safetensors.py
// converts the paper's .pth files). With decoder keys (mask_token, decoder_*): the whole
// model, load_state_dict strict; without: the encoder alone (load_encoder_state_dict), the
// decoder keeping its init. Returns what was loaded, for the log ("encoder and decoder from
// FILE" / "encoder from FILE"). Errors: the file's (nd::load) and the loads' key lists.
std::string init_mae_from(nd::models::MAEImpl& mae, const std::string& path);

}  // namespace app
