#pragma once
// Masked autoencoder (He et al. 2021, facebookresearch/mae models_mae.py) for 28x28
// single-channel images: 4x4 patches (49 tokens of 16 pixels), a ViT encoder that sees
// only the 25% of patches kept by per-sample random masking, a small decoder that
// predicts every patch, and an MSE loss on per-patch normalised pixels of the masked
// patches only. Parameter names are those of the same tree in PyTorch with
// nn.MultiheadAttention blocks (docs/models.md lists them).
// Tests: tests/models/mae_test.cpp, tests/models/golden_models_test.cpp.
#include <string>

#include <nanoddp.h>

namespace nd::models {

struct MAEConfig {
  int64_t img_size = 28, patch_size = 4;
  int64_t embed_dim = 64, depth = 2, num_heads = 4;
  int64_t decoder_embed_dim = 32, decoder_depth = 1, decoder_num_heads = 4;
  double mlp_ratio = 4.0;
  double mask_ratio = 0.75;
  bool norm_pix_loss = true;

  // CPU: 64-wide encoder of depth 2, 32-wide decoder of depth 1.
  static MAEConfig tiny();
  // GPU: 192-wide encoder of depth 6 (6 heads), 96-wide decoder of depth 2.
  static MAEConfig small();
  // "tiny" or "small"; anything else throws.
  static MAEConfig by_name(const std::string& name);

  int64_t grid() const { return img_size / patch_size; }          // 7
  int64_t num_patches() const { return grid() * grid(); }         // 49
  int64_t patch_dim() const { return patch_size * patch_size; }   // 16
};

// The MAE paper's fixed 2-D sin-cos position embedding for a grid x grid layout:
// [grid * grid (+ 1), dim] f32; with cls_token a zero row comes first. Half of each row
// encodes the column (w), half the row (h); each half is [sin(p w_k), cos(p w_k)] with
// w_k = 1 / 10000^(k / (dim / 4)), k = 0 .. dim/4 - 1. requires: dim % 4 == 0.
Tensor get_2d_sincos_pos_embed(int64_t dim, int64_t grid, bool cls_token);

// images [N, 1, H, W] -> patches [N, (H/p)(W/p), p*p] (row-major patches, row-major pixels).
Tensor patchify(const Tensor& images, int64_t patch_size);
// The inverse: [N, L, p*p] -> [N, 1, H, W] for a square grid.
Tensor unpatchify(const Tensor& patches, int64_t patch_size);

// Per-sample random masking as in the reference: ids_shuffle = argsort(noise, dim 1)
// (ascending), keep the first len_keep = int(L * (1 - mask_ratio)) tokens,
// ids_restore = argsort(ids_shuffle). mask is 0 for kept, 1 for removed tokens, in the
// original order.
struct Masking {
  Tensor ids_keep;     // [N, len_keep] i64
  Tensor ids_restore;  // [N, L] i64
  Tensor mask;         // [N, L] f32
};
// requires: noise [N, L] (any floating dtype, any device); results on noise's device.
Masking random_masking(const Tensor& noise, double mask_ratio);
// x [N, L, D], ids [N, K] i64 -> [N, K, D] with out[n, k] = x[n, ids[n, k]]
// (torch.gather along dim 1 with ids expanded over D); differentiable in x. ids on the
// cpu cost no wait for a GPU; ids on a GPU are read back to be checked.
Tensor gather_tokens(const Tensor& x, const Tensor& ids);

// Pre-LN transformer block (timm's Block with nn.MultiheadAttention):
//   x = x + attn(norm1(x));  x = x + mlp(norm2(x)),  mlp = Linear, GELU, Linear.
// Names: norm1.{weight,bias}, attn.{in_proj_weight,in_proj_bias,out_proj.weight,
// out_proj.bias}, norm2.*, mlp.0.{weight,bias}, mlp.2.{weight,bias}.
class TransformerBlockImpl : public nn::Module {
 public:
  TransformerBlockImpl(int64_t dim, int64_t num_heads, double mlp_ratio);
  // x [N, L, dim].
  Tensor forward(const Tensor& x) override;

  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  nn::MultiheadAttention attn{nullptr};
  nn::Sequential mlp{nullptr};
};
ND_MODULE(TransformerBlock);

struct MAEOutput {
  Tensor loss;  // 0-d: mean over masked patches of the per-patch MSE
  Tensor pred;  // [N, L, patch_dim]: predicted (normalised, with norm_pix_loss) pixels
  Tensor mask;  // [N, L] f32, 1 = masked
};

struct MAEEncoderOutput {
  Tensor latent;       // [N, 1 + len_keep, embed_dim]: cls token first, after the final norm
  Tensor mask;         // [N, L] f32, 1 = masked
  Tensor ids_restore;  // [N, L] i64, on the cpu (where the masking is computed)
};

// Parameters: cls_token [1, 1, E], mask_token [1, 1, Ed], patch_embed.{weight,bias}
// (Linear patch_dim -> E), blocks.i.*, norm.*, decoder_embed.*, decoder_blocks.i.*,
// decoder_norm.*, decoder_pred.* (Linear Ed -> patch_dim). Buffers: pos_embed
// [1, L + 1, E], decoder_pos_embed [1, L + 1, Ed] (fixed sin-cos).
// Init as the reference: Linear weights xavier_uniform_, biases 0, LayerNorm 1 / 0,
// cls_token and mask_token N(0, 0.02^2); attention in_proj xavier_uniform_ (PyTorch's).
class MAEImpl : public nn::Module {
 public:
  explicit MAEImpl(const MAEConfig& config = MAEConfig::tiny());

  // images [N, 1, 28, 28]. noise [N, L] decides the masking (argsort, smallest kept);
  // undefined: drawn by nd::rand from the default generator. mask_ratio 0 keeps every
  // token in its original order (no noise drawn). The masking runs on the host: noise on
  // the cpu costs no wait for a GPU (the apps keep it there), noise on a GPU is read back.
  MAEEncoderOutput forward_encoder(const Tensor& images, double mask_ratio, const Tensor& noise = {});
  // latent [N, 1 + len_keep, E] -> predictions [N, L, patch_dim].
  Tensor forward_decoder(const Tensor& latent, const Tensor& ids_restore);
  // Loss on masked patches: mean over patches with mask 1 of mean_j (pred - target)^2,
  // target = patchify(images), per patch normalised to (t - mean) / sqrt(var + 1e-6)
  // (unbiased var) when norm_pix_loss.
  Tensor forward_loss(const Tensor& images, const Tensor& pred, const Tensor& mask) const;
  // All three, with config.mask_ratio. (Hides Module::forward: an MAE is not a layer
  // to chain in a Sequential.)
  MAEOutput forward(const Tensor& images, const Tensor& noise = {});
  // Frozen-encoder features for linear probes: the mean of the patch tokens (no
  // masking, cls token excluded) after the encoder norm, [N, E].
  Tensor features(const Tensor& images);

  MAEConfig config;
  Tensor cls_token, mask_token, pos_embed, decoder_pos_embed;
  nn::Linear patch_embed{nullptr}, decoder_embed{nullptr}, decoder_pred{nullptr};
  nn::ModuleList blocks{nullptr}, decoder_blocks{nullptr};
  nn::LayerNorm norm{nullptr}, decoder_norm{nullptr};
};
ND_MODULE(MAE);

}  // namespace nd::models
