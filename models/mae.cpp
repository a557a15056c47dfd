#include "models/mae.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/activation_checkpoint.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/attention.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/index.h"
#include "engine/ops/reduce.h"
#include "engine/ops/view.h"

namespace nd::models {

PatchEmbedImpl::PatchEmbedImpl(int64_t in_chans, int64_t embed_dim, int64_t patch_size) : nn::Module("PatchEmbed") {
  proj = register_module("proj", nn::Conv2d(nn::Conv2dOptions(in_chans, embed_dim, patch_size).stride(patch_size)));
}

Tensor PatchEmbedImpl::forward(const Tensor& images) {
  return proj(images).flatten(2).transpose(1, 2);  // [N, E, h, w] -> [N, h * w, E]
}

AttentionImpl::AttentionImpl(int64_t dim, int64_t heads) : nn::Module("Attention"), num_heads(heads) {
  ND_CHECK(dim > 0 && heads > 0 && dim % heads == 0, "Attention: dim must be a positive multiple of num_heads, got dim=",
           dim, ", num_heads=", heads);
  qkv = register_module("qkv", nn::Linear(dim, 3 * dim));
  proj = register_module("proj", nn::Linear(dim, dim));
}

Tensor AttentionImpl::forward(const Tensor& x) {
  ND_CHECK(x.dim() == 3 && x.size(2) == proj->options.in_features(), "Attention: expected x [N, L, ",
           proj->options.in_features(), "], found ", x.describe());
  const int64_t n = x.size(0), len = x.size(1), dim = x.size(2), head_dim = dim / num_heads;
  // [N, L, 3, H, D]: q, k and v are views of the one projection ([N, H, L, D] each).
  const Tensor packed = qkv(x).reshape({n, len, 3, num_heads, head_dim});
  const Tensor heads = scaled_dot_product_attention(packed.select(2, 0).transpose(1, 2),
                                                    packed.select(2, 1).transpose(1, 2),
                                                    packed.select(2, 2).transpose(1, 2));
  return proj(heads.transpose(1, 2).reshape({n, len, dim}));
}

MlpImpl::MlpImpl(int64_t dim, int64_t hidden) : nn::Module("Mlp") {
  fc1 = register_module("fc1", nn::Linear(dim, hidden));
  fc2 = register_module("fc2", nn::Linear(hidden, dim));
}

Tensor MlpImpl::forward(const Tensor& x) { return fc2(gelu(fc1(x))); }

TransformerBlockImpl::TransformerBlockImpl(int64_t dim, int64_t num_heads, double mlp_ratio)
    : nn::Module("TransformerBlock") {
  norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-6)));
  attn = register_module("attn", Attention(dim, num_heads));
  norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-6)));
  mlp = register_module("mlp", Mlp(dim, static_cast<int64_t>(dim * mlp_ratio)));
}

Tensor TransformerBlockImpl::forward(const Tensor& x) {
  const Tensor y = x + attn(norm1(x));
  return y + mlp(norm2(y));
}

MAEConfig MAEConfig::tiny() { return MAEConfig{}; }

MAEConfig MAEConfig::small() {
  MAEConfig c;
  c.embed_dim = 192, c.depth = 6, c.num_heads = 6;
  c.decoder_embed_dim = 96, c.decoder_depth = 2, c.decoder_num_heads = 3;
  return c;
}

namespace {
// models_mae.py's mae_vit_*_dec512d8b: 224x224 RGB, a 512-wide decoder of 8 blocks, 16 heads.
MAEConfig vit(int64_t patch_size, int64_t embed_dim, int64_t depth, int64_t num_heads) {
  MAEConfig c;
  c.img_size = 224, c.in_chans = 3, c.patch_size = patch_size;
  c.embed_dim = embed_dim, c.depth = depth, c.num_heads = num_heads;
  c.decoder_embed_dim = 512, c.decoder_depth = 8, c.decoder_num_heads = 16;
  return c;
}
}  // namespace

MAEConfig MAEConfig::mae_vit_base_patch16_dec512d8b() { return vit(16, 768, 12, 12); }
MAEConfig MAEConfig::mae_vit_large_patch16_dec512d8b() { return vit(16, 1024, 24, 16); }
MAEConfig MAEConfig::mae_vit_huge_patch14_dec512d8b() { return vit(14, 1280, 32, 16); }

MAEConfig MAEConfig::by_name(const std::string& name) {
  if (name == "tiny") return tiny();
  if (name == "small") return small();
  if (name == "mae_vit_base_patch16_dec512d8b") return mae_vit_base_patch16_dec512d8b();
  if (name == "mae_vit_large_patch16_dec512d8b") return mae_vit_large_patch16_dec512d8b();
  if (name == "mae_vit_huge_patch14_dec512d8b") return mae_vit_huge_patch14_dec512d8b();
  throw Error("MAEConfig: unknown configuration '" + name +
              "' (expected tiny, small, mae_vit_base_patch16_dec512d8b, mae_vit_large_patch16_dec512d8b or "
              "mae_vit_huge_patch14_dec512d8b)");
}

Tensor get_2d_sincos_pos_embed(int64_t dim, int64_t grid, bool cls_token) {
  ND_CHECK(dim > 0 && dim % 4 == 0, "get_2d_sincos_pos_embed: dim must be a positive multiple of 4, got ", dim);
  const int64_t quarter = dim / 4, rows = grid * grid + (cls_token ? 1 : 0);
  std::vector<double> values(rows * dim, 0.0);
  double* out = values.data() + (cls_token ? dim : 0);
  for (int64_t i = 0; i < grid; ++i)      // row (h)
    for (int64_t j = 0; j < grid; ++j) {  // column (w)
      double* row = out + (i * grid + j) * dim;
      for (int64_t k = 0; k < quarter; ++k) {
        const double omega = 1.0 / std::pow(10000.0, static_cast<double>(k) / quarter);
        // [sin(j w), cos(j w)] for the column, then [sin(i w), cos(i w)] for the row.
        row[k] = std::sin(j * omega), row[quarter + k] = std::cos(j * omega);
        row[2 * quarter + k] = std::sin(i * omega), row[3 * quarter + k] = std::cos(i * omega);
      }
    }
  return tensor(values).reshape({rows, dim});
}

Tensor patchify(const Tensor& images, int64_t p) {
  ND_CHECK(p > 0 && images.dim() == 4 && images.size(2) % p == 0 && images.size(3) % p == 0,
           "patchify: expected images [N, C, H, W] with H and W multiples of ", p, ", found ", images.describe());
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2) / p, w = images.size(3) / p;
  // [N, C, h, p, w, q] -> [N, h, w, p, q, C]
  return images.reshape({n, c, h, p, w, p}).permute({0, 2, 4, 3, 5, 1}).reshape({n, h * w, p * p * c});
}

Tensor unpatchify(const Tensor& patches, int64_t p, int64_t c) {
  ND_CHECK(p > 0 && c > 0 && patches.dim() == 3 && patches.size(2) == p * p * c, "unpatchify: expected patches [N, L, ",
           p * p * c, "] (", p, "x", p, " pixels of ", c, " channel(s)), found ", patches.describe());
  const int64_t n = patches.size(0), g = static_cast<int64_t>(std::lround(std::sqrt(patches.size(1))));
  ND_CHECK(g * g == patches.size(1), "unpatchify: expected a square number of patches, found ", patches.size(1));
  // [N, h, w, p, q, C] -> [N, C, h, p, w, q]
  return patches.reshape({n, g, g, p, p, c}).permute({0, 5, 1, 3, 2, 4}).reshape({n, c, g * p, g * p});
}

Masking random_masking(const Tensor& noise, double mask_ratio) {
  ND_CHECK(noise.dim() == 2 && noise.is_floating_point(), "random_masking: expected floating noise [N, L], found ",
           noise.describe());
  ND_CHECK(mask_ratio >= 0 && mask_ratio < 1, "random_masking: mask_ratio must be in [0, 1), got ", mask_ratio);
  const int64_t n = noise.size(0), len = noise.size(1);
  const auto keep = static_cast<int64_t>(len * (1 - mask_ratio));
  const Tensor host = noise.detach().to(kCPU).to(kFloat64).contiguous();
  const double* v = host.data_ptr<double>();
  Tensor ids_keep = empty({n, keep}, kInt64), ids_restore = empty({n, len}, kInt64);
  int64_t* kp = ids_keep.data_ptr<int64_t>();
  int64_t* rp = ids_restore.data_ptr<int64_t>();
  std::vector<int64_t> shuffle(len);
  std::vector<double> mask_values(n * len);
  for (int64_t b = 0; b < n; ++b) {
    const double* row = v + b * len;
    std::iota(shuffle.begin(), shuffle.end(), 0);
    std::stable_sort(shuffle.begin(), shuffle.end(), [&](int64_t x, int64_t y) { return row[x] < row[y]; });
    for (int64_t k = 0; k < len; ++k) {
      rp[b * len + shuffle[k]] = k;  // ids_restore = argsort(ids_shuffle)
      mask_values[b * len + shuffle[k]] = k < keep ? 0.0 : 1.0;
    }
    std::copy_n(shuffle.begin(), keep, kp + b * keep);
  }
  const Tensor mask = tensor(mask_values, noise.dtype()).reshape({n, len});
  const Device device = noise.device();
  return {ids_keep.to(device), ids_restore.to(device), mask.to(device)};
}

Tensor gather_tokens(const Tensor& x, const Tensor& ids) {
  ND_CHECK(x.dim() == 3 && ids.dim() == 2 && ids.size(0) == x.size(0) && ids.dtype() == kInt64,
           "gather_tokens: expected x [N, L, D] and int64 ids [N, K], found ", x.describe(), " and ", ids.describe());
  const int64_t n = x.size(0), len = x.size(1), k = ids.size(1);
  // Row ids[b, j] of sample b is row b * L + ids[b, j] of x viewed as [N * L, D].
  const Tensor host = ids.to(kCPU).contiguous();
  Tensor flat_ids = empty({n * k}, kInt64);
  const int64_t* src = host.data_ptr<int64_t>();
  int64_t* dst = flat_ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t j = 0; j < k; ++j) {
      ND_CHECK(src[b * k + j] >= 0 && src[b * k + j] < len, "gather_tokens: id ", src[b * k + j],
               " is out of range for ", len, " tokens");
      dst[b * k + j] = b * len + src[b * k + j];
    }
  // flat_ids stays on the cpu: index_select checks it there and copies it without waiting.
  return x.reshape({n * len, x.size(2)}).index_select(0, flat_ids).reshape({n, k, x.size(2)});
}

namespace {
// The reference's _init_weights on Linear layers: xavier_uniform_ weight, zero bias.
void init_linears(nn::Module& module) {
  module.apply([](nn::Module& m) {
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(&m)) {
      nn::init::xavier_uniform_(linear->weight);
      if (linear->bias.defined()) nn::init::zeros_(linear->bias);
    }
  });
}

nn::LayerNorm layer_norm(int64_t dim) { return nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-6)); }

nn::ModuleList transformer_blocks(int64_t count, int64_t dim, int64_t num_heads, double mlp_ratio) {
  nn::ModuleList list;
  for (int64_t i = 0; i < count; ++i) list->push_back(TransformerBlock(dim, num_heads, mlp_ratio));
  return list;
}

// The blocks in order, each under nd::checkpoint when `checkpointed`.
Tensor run_blocks(const nn::ModuleList& blocks, Tensor x, bool checkpointed) {
  for (const auto& block : *blocks)
    x = checkpointed ? checkpoint([block](const Tensor& in) { return block->forward(in); }, x) : block->forward(x);
  return x;
}

// [1, L + 1, dim]: the fixed sin-cos rows, cls position first.
Tensor pos_embed_of(int64_t dim, const MAEConfig& c) {
  return get_2d_sincos_pos_embed(dim, c.grid(), true).reshape({1, c.num_patches() + 1, dim});
}

const MAEConfig& checked(const MAEConfig& c) {
  ND_CHECK(c.img_size > 0 && c.patch_size > 0 && c.in_chans > 0 && c.img_size % c.patch_size == 0,
           "MAE: img_size must be a positive multiple of patch_size and in_chans positive, got img_size ", c.img_size,
           ", patch_size ", c.patch_size, ", in_chans ", c.in_chans);
  ND_CHECK(c.mask_ratio >= 0 && c.mask_ratio < 1, "MAE: mask_ratio must be in [0, 1), got ", c.mask_ratio);
  return c;
}
}  // namespace

MAEEncoderImpl::MAEEncoderImpl(const MAEConfig& c) : MAEEncoderImpl(c, "MAEEncoder") {}

MAEEncoderImpl::MAEEncoderImpl(const MAEConfig& c, const std::string& type_name)
    : nn::Module(type_name), config(checked(c)) {
  patch_embed = register_module("patch_embed", PatchEmbed(c.in_chans, c.embed_dim, c.patch_size));
  cls_token = register_parameter("cls_token", zeros({1, 1, c.embed_dim}));
  pos_embed = register_buffer("pos_embed", pos_embed_of(c.embed_dim, c));
  blocks = register_module("blocks", transformer_blocks(c.depth, c.embed_dim, c.num_heads, c.mlp_ratio));
  norm = register_module("norm", layer_norm(c.embed_dim));

  // The reference's initialize_weights: the patch projection like a Linear (xavier on its
  // [E, C p p] view, which shares its storage), then the tokens, then every Linear.
  const Tensor& w = patch_embed->proj->weight;
  nn::init::xavier_uniform_(w.reshape({w.size(0), w.numel() / w.size(0)}));
  nn::init::normal_(cls_token, 0.0, 0.02);
  init_linears(*this);
}

MAEEncoderOutput MAEEncoderImpl::forward_encoder(const Tensor& images, double mask_ratio, const Tensor& noise) {
  const int64_t s = config.img_size, n = images.size(0), len = config.num_patches();
  ND_CHECK(images.dim() == 4 && images.size(1) == config.in_chans && images.size(2) == s && images.size(3) == s,
           "MAE: expected images [N, ", config.in_chans, ", ", s, ", ", s, "], found ", images.describe());
  Tensor x = patch_embed(images) + pos_embed.slice(1, 1, len + 1);
  MAEEncoderOutput out;
  if (mask_ratio == 0 && !noise.defined()) {
    out.mask = zeros({n, len}, images.options());
    out.ids_restore = arange(static_cast<double>(len), TensorOptions(kInt64)).reshape({1, len}).expand({n, len})
                          .contiguous();
  } else {
    // The noise may live anywhere: argsort runs on the host, and the ids stay there, so
    // that the gathers check them without waiting for the device (noise on a GPU is read
    // back first).
    const Tensor draw = noise.defined() ? noise : rand({n, len}, images.dtype());
    ND_CHECK(draw.dim() == 2 && draw.size(0) == n && draw.size(1) == len, "MAE: expected noise [", n, ", ", len,
             "], found ", draw.describe());
    const Masking m = random_masking(draw.to(kCPU), mask_ratio);
    x = gather_tokens(x, m.ids_keep);
    out.mask = m.mask.to(images.device()).to(images.dtype());
    out.ids_restore = m.ids_restore;
  }
  const Tensor cls = (cls_token + pos_embed.slice(1, 0, 1)).expand({n, 1, config.embed_dim});
  x = cat({cls, x}, 1);
  out.latent = norm(run_blocks(blocks, x, config.checkpoint_activations));
  return out;
}

Tensor MAEEncoderImpl::features(const Tensor& images) {
  const int64_t len = config.num_patches();
  return forward_encoder(images, 0.0).latent.slice(1, 1, len + 1).mean({1});
}

bool MAEEncoderImpl::is_decoder_key(const std::string& key) {
  const std::string name = key.rfind("module.", 0) == 0 ? key.substr(7) : key;
  return name == "mask_token" || name.rfind("decoder_", 0) == 0;
}

void MAEEncoderImpl::load_encoder_state_dict(const TensorDict& state) {
  // The file's encoder keys, plus this model's own decoder tensors (an MAE's, copied onto
  // themselves): one strict load checks every encoder key before anything is copied.
  TensorDict incoming;
  for (const auto& [key, value] : state)
    if (!is_decoder_key(key)) incoming[key] = value;
  for (const auto& [key, value] : state_dict())
    if (is_decoder_key(key)) incoming[key] = value;
  load_state_dict(incoming, /*strict=*/true);
}

MAEImpl::MAEImpl(const MAEConfig& c) : MAEEncoderImpl(c, "MAE") {
  decoder_embed = register_module("decoder_embed", nn::Linear(c.embed_dim, c.decoder_embed_dim));
  mask_token = register_parameter("mask_token", zeros({1, 1, c.decoder_embed_dim}));
  decoder_pos_embed = register_buffer("decoder_pos_embed", pos_embed_of(c.decoder_embed_dim, c));
  decoder_blocks = register_module(
      "decoder_blocks", transformer_blocks(c.decoder_depth, c.decoder_embed_dim, c.decoder_num_heads, c.mlp_ratio));
  decoder_norm = register_module("decoder_norm", layer_norm(c.decoder_embed_dim));
  decoder_pred = register_module("decoder_pred", nn::Linear(c.decoder_embed_dim, c.patch_dim()));

  nn::init::normal_(mask_token, 0.0, 0.02);
  init_linears(*decoder_embed);
  init_linears(*decoder_blocks);
  init_linears(*decoder_pred);
}

Tensor MAEImpl::forward_decoder(const Tensor& latent, const Tensor& ids_restore) {
  const int64_t n = latent.size(0), len = config.num_patches(), kept = latent.size(1) - 1;
  Tensor x = decoder_embed(latent);
  Tensor tokens = x.slice(1, 1, kept + 1);
  if (kept < len) tokens = cat({tokens, mask_token.expand({n, len - kept, config.decoder_embed_dim})}, 1);
  x = cat({x.slice(1, 0, 1), gather_tokens(tokens, ids_restore)}, 1) + decoder_pos_embed;
  x = run_blocks(decoder_blocks, x, config.checkpoint_activations);
  return decoder_pred(decoder_norm(x)).slice(1, 1, len + 1);
}

Tensor MAEImpl::forward_loss(const Tensor& images, const Tensor& pred, const Tensor& mask) const {
  Tensor target = patchify(images, config.patch_size);
  if (config.norm_pix_loss) {
    const Tensor mean = target.mean({-1}, true), var = target.var({-1}, 1, true);
    target = (target - mean) / (var + 1e-6).sqrt();
  }
  const Tensor per_patch = (pred - target).pow(2).mean({-1});  // [N, L]
  return (per_patch * mask).sum() / mask.sum();
}

MAEOutput MAEImpl::forward(const Tensor& images, const Tensor& noise) {
  MAEEncoderOutput enc = forward_encoder(images, config.mask_ratio, noise);
  Tensor pred = forward_decoder(enc.latent, enc.ids_restore);
  Tensor loss = forward_loss(images, pred, enc.mask);
  return {loss, pred, enc.mask};
}

}  // namespace nd::models
