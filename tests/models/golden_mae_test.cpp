// The MAE against facebookresearch/mae's MaskedAutoencoderViT (tests/golden/
// reference_models.py, timm's blocks in plain torch.nn): a twin of the ViT configs with
// the same structure at reduced depth and width (E 64, depth 2, 4 heads; Ed 32, depth 1,
// 4 heads; 32x32x3 images on 8x8 patches), closed-form weights, images and masking noise
// (golden_record.h), batch 2, with and without norm_pix_loss: the loss, predictions,
// mask, encoder latent and every gradient, recorded by make_models_golden.py in
// tests/golden/models_full.safetensors, match in f32 to 1e-4 of each tensor's scale.
// The full-size ViT-B/16 (and 2-block ViT-L/H) comparison is golden_vit_test.cpp.
#include "golden_record.h"

using namespace nd;

namespace {

// make_models_golden.py's MAE_TWIN.
models::MAEConfig twin(bool norm_pix_loss) {
  models::MAEConfig c;
  c.img_size = 32, c.patch_size = 8, c.in_chans = 3;
  c.embed_dim = 64, c.depth = 2, c.num_heads = 4;
  c.decoder_embed_dim = 32, c.decoder_depth = 1, c.decoder_num_heads = 4;
  c.norm_pix_loss = norm_pix_loss;
  return c;
}

}  // namespace

TEST_CASE("golden: MAE twin of the ViT configs (3 channels, 8x8 patches), norm_pix_loss, fixed masking noise") {
  models::MAE mae(twin(true));
  nd::testing::check_mae_recorded(nd::testing::load_golden("models_full.safetensors"), "mae_twin", mae, 2, 1e-4);
}

TEST_CASE("golden: MAE twin without norm_pix_loss (raw pixel targets)") {
  models::MAE mae(twin(false));
  nd::testing::check_mae_recorded(nd::testing::load_golden("models_full.safetensors"), "mae_twin_raw", mae, 2, 1e-4);
}
