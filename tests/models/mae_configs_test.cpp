// The MAE at the paper's sizes and the encoder alone: the state_dict keys and shapes of
// mae_vit_{base,large,huge}_* against the reference's (tests/golden/mae_keys.txt, listed
// by make_models_golden.py from models_mae.py's tree), ViT-L and ViT-H cut to 2 blocks
// running at 224x224, and MAEEncoder loading from a whole MAE's state dict or an
// encoder-only one (the released pretrain checkpoints' layout), with every error path.
#include <cmath>
#include <map>
#include <sstream>

#include "golden_record.h"

using namespace nd;
using models::MAEConfig;

namespace {

// "blocks.<i>.rest" -> {"blocks.", i, "rest"}; other keys -> {key, -1, ""}.
std::tuple<std::string, int64_t, std::string> split_block(const std::string& key) {
  for (const std::string prefix : {"blocks.", "decoder_blocks."}) {
    if (key.rfind(prefix, 0) != 0) continue;
    const size_t dot = key.find('.', prefix.size());
    return {prefix, std::stoll(key.substr(prefix.size(), dot - prefix.size())), key.substr(dot + 1)};
  }
  return {key, -1, ""};
}

// The keys and shapes of `full` listed from `mae`, the same config with fewer blocks:
// every block has the keys and shapes of block 0.
std::map<std::string, std::string> full_depth_keys(const nn::Module& mae, const MAEConfig& full) {
  const int64_t depth = full.depth, decoder_depth = full.decoder_depth;
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : mae.state_dict()) {
    const auto [prefix, index, rest] = split_block(key);
    if (index < 0) out[key] = nd::testing::shape_text(value.sizes());
    if (index != 0) continue;
    for (int64_t i = 0; i < (prefix == "blocks." ? depth : decoder_depth); ++i)
      out[prefix + std::to_string(i) + "." + rest] = nd::testing::shape_text(value.sizes());
  }
  return out;
}

int64_t count_parameters(const std::map<std::string, std::string>& keys) {
  int64_t total = 0;
  for (const auto& [key, shape] : keys) {
    if (key.ends_with("pos_embed")) continue;  // fixed, never trained
    int64_t n = 1;
    std::stringstream ss(shape);
    for (std::string d; std::getline(ss, d, 'x');) n *= std::stoll(d);
    total += n;
  }
  return total;
}

// Builds `name` with 2 encoder and 2 decoder blocks, checks its keys and shapes expanded to
// full depth against the reference's list and the trained parameter count, returns it.
models::MAE two_block_twin(const std::string& name, int64_t reference_parameters) {
  const MAEConfig full = MAEConfig::by_name(name);
  CHECK((full.img_size == 224 && full.in_chans == 3 && full.decoder_embed_dim == 512 && full.decoder_depth == 8 &&
         full.decoder_num_heads == 16 && full.mlp_ratio == 4.0 && full.norm_pix_loss));
  MAEConfig c = full;
  c.depth = c.decoder_depth = 2;
  models::MAE mae(c);
  const auto reference = nd::testing::mae_reference_keys();
  REQUIRE(reference.count(name));
  const auto ours = full_depth_keys(*mae, full);
  CHECK(ours == reference.at(name));
  CHECK(count_parameters(ours) == reference_parameters);
  return mae;
}

// The 2-block twin of `name` on a 224x224 image: predictions for every patch, the
// encoder on cls + int(L / 4) tokens.
void check_shapes(models::MAE& mae, int64_t embed, int64_t tokens, int64_t patch_dim) {
  manual_seed(5);
  const Tensor images = rand({1, 3, 224, 224}) * 2 - 1;
  NoGradGuard no_grad;
  const models::MAEOutput out = mae(images);
  const int64_t kept = tokens / 4;
  CHECK(out.pred.sizes() == Shape{1, tokens, patch_dim});
  CHECK(out.mask.sum().item() == tokens - kept);
  CHECK(std::isfinite(out.loss.item()));
  CHECK(mae->forward_encoder(images, 0.75).latent.sizes() == Shape{1, 1 + kept, embed});
}

}  // namespace

// Trained parameter counts (pos_embed excluded) are PyTorch's for models_mae.py's trees.
TEST_CASE("MAE ViT-B/16: state_dict keys and shapes are models_mae.py's (mae_keys.txt)") {
  models::MAE mae = two_block_twin("mae_vit_base_patch16_dec512d8b", 111655680);
  CHECK(nd::testing::error_message([&] { mae(zeros({1, 1, 28, 28})); }) ==
        "MAE: expected images [N, 3, 224, 224], found [cpu f32 [1, 1, 28, 28]]");
}

TEST_CASE("MAE ViT-L/16: keys and shapes as models_mae.py's, 2 blocks run at 224x224") {
  models::MAE mae = two_block_twin("mae_vit_large_patch16_dec512d8b", 329239296);
  check_shapes(mae, 1024, 196, 768);
}

TEST_CASE("MAE ViT-H/14: keys and shapes as models_mae.py's, 2 blocks run at 224x224") {
  models::MAE mae = two_block_twin("mae_vit_huge_patch14_dec512d8b", 656613964);
  const MAEConfig& c = mae->config;
  CHECK((c.patch_size == 14 && c.grid() == 16 && c.num_patches() == 256 && c.patch_dim() == 588));
  check_shapes(mae, 1280, 256, 588);
}

TEST_CASE("MAEEncoder: the encoder alone loads from a whole MAE or from its own keys, strictly") {
  MAEConfig c = MAEConfig::tiny();
  c.in_chans = 3, c.img_size = 16;
  manual_seed(6);
  models::MAE mae(c);
  models::MAEEncoder encoder(c);
  const TensorDict full = mae->state_dict();
  // Its keys are the MAE's without the decoder's.
  std::vector<std::string> expected;
  for (const auto& [k, v] : full)
    if (!models::MAEEncoderImpl::is_decoder_key(k)) expected.push_back(k);
  std::vector<std::string> keys;
  for (const auto& [k, v] : encoder->state_dict()) keys.push_back(k);
  CHECK(keys == expected);
  CHECK(models::MAEEncoderImpl::is_decoder_key("decoder_blocks.0.attn.qkv.weight"));
  CHECK(models::MAEEncoderImpl::is_decoder_key("module.mask_token"));
  CHECK(!models::MAEEncoderImpl::is_decoder_key("blocks.0.norm1.weight"));

  const Tensor images = rand({2, 3, 16, 16});
  encoder->load_encoder_state_dict(full);
  nd::testing::check_close(encoder->features(images), mae->features(images), 0, 0, "features after loading");
  TensorDict encoder_only;
  for (const auto& k : expected) encoder_only[k] = full.at(k);
  models::MAEEncoder again(c);
  again->load_encoder_state_dict(encoder_only);
  nd::testing::check_close(again->forward_encoder(images, 0.0).latent, mae->forward_encoder(images, 0.0).latent, 0, 0,
                           "latent from the encoder-only keys");

  // On a whole MAE the decoder stays as it was; a strict load of the encoder's keys alone
  // names the decoder's as missing.
  models::MAE other(c);
  const Tensor pred_before = other->decoder_pred->weight.clone();
  other->load_encoder_state_dict(encoder_only);
  nd::testing::check_close(other->decoder_pred->weight, pred_before, 0, 0, "decoder untouched");
  nd::testing::check_close(other->blocks[0]->state_dict().at("attn.qkv.weight"),
                           full.at("blocks.0.attn.qkv.weight"), 0, 0, "encoder loaded");
  const std::string strict = nd::testing::error_message([&] { other->load_state_dict(encoder_only); });
  CHECK(strict.find("Missing key(s): \"decoder_blocks.0.attn.proj.bias\"") != std::string::npos);

  // Encoder keys missing, unexpected or of another shape: one error, nothing copied.
  TensorDict broken = encoder_only;
  broken.erase("norm.bias");
  broken["head.weight"] = zeros({10, 64});
  broken["cls_token"] = zeros({1, 1, 32});
  const Tensor cls_before = again->cls_token.clone();
  CHECK(nd::testing::error_message([&] { again->load_encoder_state_dict(broken); }) ==
        "Error(s) in loading state_dict for MAEEncoder:\n  Missing key(s): \"norm.bias\"\n"
        "  Unexpected key(s): \"head.weight\"\n  Size mismatch: \"cls_token: checkpoint [1, 1, 32] vs module [1, 1, 64]\"\n"
        "  (pass strict=false to load the matching keys and get these lists back)");
  nd::testing::check_close(again->cls_token, cls_before, 0, 0, "nothing copied");
}
