#pragma once
// Masked autoencoder (He et al. 2021) as facebookresearch/mae's MaskedAutoencoderViT
// (models_mae.py), with its state_dict keys and shapes: a ViT encoder (timm's blocks)
// that sees only the patches kept by per-sample random masking, a small decoder that
// predicts every patch, and an MSE loss on the masked patches only (per-patch
// normalised pixels with norm_pix_loss). Configs: the paper's ViT-B/16, ViT-L/16 and
// ViT-H/14 on 224x224 RGB, and tiny and small on 28x28 single-channel images.
// MAEEncoderImpl is the encoder alone (cls token, patch and position embeddings,
// blocks, norm), which loads from a whole MAE's file or an encoder-only one;
// MAEImpl is the encoder plus the decoder.
// Tests: tests/models/mae_test.cpp, golden_models_test.cpp, golden_mae_test.cpp.
#include <string>

#include "engine/nn/nn.h"
#include "engine/tensor.h"

namespace nd::models {

// ---- the Vision Transformer pieces, with timm's names (timm.models.vision_transformer:
// PatchEmbed, Attention, Mlp, Block). Dropout and drop-path are absent (the MAE uses none).

// images [N, C, H, W] -> tokens [N, (H/p)(W/p), E]: proj = Conv2d(C, E, p, stride p)
// (with bias), flattened to row-major patch order. Name: proj.{weight,bias}.
class PatchEmbedImpl : public nn::Module {
 public:
  PatchEmbedImpl(int64_t in_chans, int64_t embed_dim, int64_t patch_size);
  Tensor forward(const Tensor& images) override;

  nn::Conv2d proj{nullptr};
};
ND_MODULE(PatchEmbed);

// Multi-head self-attention as timm's: qkv = Linear(dim, 3 dim) with bias (rows q, k, v,
// each head's D = dim / heads columns in order), softmax(q k^T / sqrt(D)) v through the
// fused nd::scaled_dot_product_attention, proj = Linear(dim, dim).
// Names: qkv.{weight,bias}, proj.{weight,bias}.
class AttentionImpl : public nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t num_heads);
  // x [N, L, dim].
  Tensor forward(const Tensor& x) override;

  int64_t num_heads;
  nn::Linear qkv{nullptr}, proj{nullptr};
};
ND_MODULE(Attention);

// fc1 = Linear(dim, hidden), GELU (exact), fc2 = Linear(hidden, dim).
// Names: fc1.{weight,bias}, fc2.{weight,bias}.
class MlpImpl : public nn::Module {
 public:
  MlpImpl(int64_t dim, int64_t hidden);
  Tensor forward(const Tensor& x) override;

  nn::Linear fc1{nullptr}, fc2{nullptr};
};
ND_MODULE(Mlp);

// Pre-LN transformer block (timm's Block): x = x + attn(norm1(x)); x = x + mlp(norm2(x)),
// LayerNorm eps 1e-6 (the MAE's norm_layer), mlp hidden = int(dim * mlp_ratio).
// Names: norm1.*, attn.qkv.*, attn.proj.*, norm2.*, mlp.fc1.*, mlp.fc2.*.
class TransformerBlockImpl : public nn::Module {
 public:
  TransformerBlockImpl(int64_t dim, int64_t num_heads, double mlp_ratio);
  // x [N, L, dim].
  Tensor forward(const Tensor& x) override;

  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
ND_MODULE(TransformerBlock);

// ---- the MAE

struct MAEConfig {
  int64_t img_size = 28, patch_size = 4, in_chans = 1;
  int64_t embed_dim = 64, depth = 2, num_heads = 4;
  int64_t decoder_embed_dim = 32, decoder_depth = 1, decoder_num_heads = 4;
  double mlp_ratio = 4.0;
  double mask_ratio = 0.75;
  // Targets normalised per patch (the paper's choice; models_mae.py's argument defaults
  // to false, main_pretrain.py's --norm_pix_loss turns it on).
  bool norm_pix_loss = true;
  // Each encoder and decoder block runs under nd::checkpoint (engine/activation_checkpoint.h):
  // its activations are recomputed in backward instead of kept, the same gradients for a
  // second forward of the blocks. Not part of the state_dict.
  bool checkpoint_activations = false;

  // CPU, 28x28x1 on 4x4 patches: 64-wide encoder of depth 2, 32-wide decoder of depth 1.
  static MAEConfig tiny();
  // GPU, 28x28x1 on 4x4 patches: 192-wide encoder of depth 6 (6 heads), 96-wide decoder of depth 2.
  static MAEConfig small();
  // 224x224x3; decoder 512 wide, 8 blocks, 16 heads (models_mae.py's *_dec512d8b).
  static MAEConfig mae_vit_base_patch16_dec512d8b();   // 16x16 patches, 768 wide, 12 blocks, 12 heads
  static MAEConfig mae_vit_large_patch16_dec512d8b();  // 16x16 patches, 1024 wide, 24 blocks, 16 heads
  static MAEConfig mae_vit_huge_patch14_dec512d8b();   // 14x14 patches, 1280 wide, 32 blocks, 16 heads
  // One of the five names above; anything else throws, listing them.
  static MAEConfig by_name(const std::string& name);

  int64_t grid() const { return img_size / patch_size; }                    // tiny 7, ViT-B 14
  int64_t num_patches() const { return grid() * grid(); }                   // tiny 49, ViT-B 196
  int64_t patch_dim() const { return patch_size * patch_size * in_chans; }  // tiny 16, ViT-B 768
};

// The MAE paper's fixed 2-D sin-cos position embedding for a grid x grid layout:
// [grid * grid (+ 1), dim] f32; with cls_token a zero row comes first. Half of each row
// encodes the column (w), half the row (h); each half is [sin(p w_k), cos(p w_k)] with
// w_k = 1 / 10000^(k / (dim / 4)), k = 0 .. dim/4 - 1. requires: dim % 4 == 0.
Tensor get_2d_sincos_pos_embed(int64_t dim, int64_t grid, bool cls_token);

// images [N, C, H, W] -> patches [N, (H/p)(W/p), p*p*C]: row-major patches, and inside a
// patch row-major pixels with the C channels of a pixel together (models_mae.py's
// 'nchpwq->nhwpqc').
Tensor patchify(const Tensor& images, int64_t patch_size);
// The inverse: [N, L, p*p*C] -> [N, C, H, W] for a square grid.
Tensor unpatchify(const Tensor& patches, int64_t patch_size, int64_t channels = 1);

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

// The encoder. Parameters: cls_token [1, 1, E], patch_embed.proj.{weight [E, C, p, p],
// bias [E]}, blocks.i.*, norm.*. Buffer: pos_embed [1, L + 1, E] (fixed sin-cos; a
// parameter that never trains in the reference, the same state_dict key).
// Init as the reference: patch_embed.proj.weight xavier_uniform_ on its [E, C p p] view
// (like a Linear), its bias Conv2d's default, cls_token N(0, 0.02^2), every Linear
// xavier_uniform_ with zero bias, LayerNorm 1 / 0.
class MAEEncoderImpl : public nn::Module {
 public:
  explicit MAEEncoderImpl(const MAEConfig& config = MAEConfig::tiny());

  // images [N, C, img_size, img_size]. noise [N, L] decides the masking (argsort,
  // smallest kept); undefined: drawn by nd::rand from the default generator. mask_ratio 0
  // keeps every token in its original order (no noise drawn). The masking runs on the
  // host: noise on the cpu costs no wait for a GPU (the apps keep it there), noise on a
  // GPU is read back.
  MAEEncoderOutput forward_encoder(const Tensor& images, double mask_ratio, const Tensor& noise = {});
  // Frozen-encoder features for linear probes: the mean of the patch tokens (no
  // masking, cls token excluded) after the encoder norm, [N, E].
  Tensor features(const Tensor& images);
  // Loads the encoder from a state dict of a whole MAE or of an encoder alone (the
  // paper's released pretrain checkpoints, converted by models/mae_pth_to_safetensors.py):
  // the decoder's keys (mask_token and decoder_*) are passed over, every other key must
  // be this model's, and every key of the encoder must be there; otherwise one nd::Error
  // lists the missing, unexpected and wrong-shaped keys. On an MAEImpl it leaves the
  // decoder as it was.
  void load_encoder_state_dict(const TensorDict& state);
  // The keys load_encoder_state_dict passes over: "mask_token" and "decoder_*".
  static bool is_decoder_key(const std::string& key);

  MAEConfig config;
  Tensor cls_token, pos_embed;
  PatchEmbed patch_embed{nullptr};
  nn::ModuleList blocks{nullptr};
  nn::LayerNorm norm{nullptr};

 protected:
  MAEEncoderImpl(const MAEConfig& config, const std::string& type_name);
};
ND_MODULE(MAEEncoder);

// The whole MAE: the encoder's names plus mask_token [1, 1, Ed], decoder_embed.*
// (Linear E -> Ed), decoder_blocks.i.*, decoder_norm.*, decoder_pred.* (Linear Ed ->
// patch_dim) and the buffer decoder_pos_embed [1, L + 1, Ed]. Init: mask_token
// N(0, 0.02^2), Linears and LayerNorms as the encoder's.
class MAEImpl : public MAEEncoderImpl {
 public:
  explicit MAEImpl(const MAEConfig& config = MAEConfig::tiny());

  // latent [N, 1 + len_keep, E] -> predictions [N, L, patch_dim].
  Tensor forward_decoder(const Tensor& latent, const Tensor& ids_restore);
  // Loss on masked patches: mean over patches with mask 1 of mean_j (pred - target)^2,
  // target = patchify(images), per patch normalised to (t - mean) / sqrt(var + 1e-6)
  // (unbiased var) when norm_pix_loss.
  Tensor forward_loss(const Tensor& images, const Tensor& pred, const Tensor& mask) const;
  // All three, with config.mask_ratio. (Hides Module::forward: an MAE is not a layer
  // to chain in a Sequential.)
  MAEOutput forward(const Tensor& images, const Tensor& noise = {});

  Tensor mask_token, decoder_pos_embed;
  nn::Linear decoder_embed{nullptr}, decoder_pred{nullptr};
  nn::ModuleList decoder_blocks{nullptr};
  nn::LayerNorm decoder_norm{nullptr};
};
ND_MODULE(MAE);

}  // namespace nd::models
