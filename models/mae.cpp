#include "models/mae.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace nd::models {

MAEConfig MAEConfig::tiny() { return MAEConfig{}; }

MAEConfig MAEConfig::small() {
  MAEConfig c;
  c.embed_dim = 192, c.depth = 6, c.num_heads = 6;
  c.decoder_embed_dim = 96, c.decoder_depth = 2, c.decoder_num_heads = 3;
  return c;
}

MAEConfig MAEConfig::by_name(const std::string& name) {
  if (name == "tiny") return tiny();
  if (name == "small") return small();
  throw Error("MAEConfig: unknown configuration '" + name + "' (expected tiny or small)");
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
  ND_CHECK(images.dim() == 4 && images.size(1) == 1 && images.size(2) % p == 0 && images.size(3) % p == 0,
           "patchify: expected images [N, 1, H, W] with H and W multiples of ", p, ", found ", images.describe());
  const int64_t n = images.size(0), h = images.size(2) / p, w = images.size(3) / p;
  // [N, 1, h, p, w, q] -> [N, h, w, p, q, 1]
  return images.reshape({n, 1, h, p, w, p}).permute({0, 2, 4, 3, 5, 1}).reshape({n, h * w, p * p});
}

Tensor unpatchify(const Tensor& patches, int64_t p) {
  ND_CHECK(patches.dim() == 3 && patches.size(2) == p * p,
           "unpatchify: expected patches [N, L, ", p * p, "], found ", patches.describe());
  const int64_t n = patches.size(0), g = static_cast<int64_t>(std::lround(std::sqrt(patches.size(1))));
  ND_CHECK(g * g == patches.size(1), "unpatchify: expected a square number of patches, found ", patches.size(1));
  // [N, h, w, p, q, 1] -> [N, 1, h, p, w, q]
  return patches.reshape({n, g, g, p, p, 1}).permute({0, 5, 1, 3, 2, 4}).reshape({n, 1, g * p, g * p});
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

TransformerBlockImpl::TransformerBlockImpl(int64_t dim, int64_t num_heads, double mlp_ratio)
    : nn::Module("TransformerBlock") {
  const auto hidden = static_cast<int64_t>(dim * mlp_ratio);
  norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-6)));
  attn = register_module("attn",
                         nn::MultiheadAttention(nn::MultiheadAttentionOptions(dim, num_heads).batch_first(true)));
  norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-6)));
  mlp = register_module("mlp", nn::Sequential(nn::Linear(dim, hidden), nn::GELU(), nn::Linear(hidden, dim)));
}

Tensor TransformerBlockImpl::forward(const Tensor& x) {
  const Tensor h = norm1(x);
  const Tensor y = x + std::get<0>(attn(h, h, h));
  return y + mlp(norm2(y));
}

MAEImpl::MAEImpl(const MAEConfig& c) : nn::Module("MAE"), config(c) {
  ND_CHECK(c.img_size % c.patch_size == 0, "MAE: img_size ", c.img_size, " is not a multiple of patch_size ",
           c.patch_size);
  ND_CHECK(c.mask_ratio >= 0 && c.mask_ratio < 1, "MAE: mask_ratio must be in [0, 1), got ", c.mask_ratio);
  const int64_t len = c.num_patches();
  cls_token = register_parameter("cls_token", zeros({1, 1, c.embed_dim}));
  mask_token = register_parameter("mask_token", zeros({1, 1, c.decoder_embed_dim}));
  pos_embed = register_buffer(
      "pos_embed", get_2d_sincos_pos_embed(c.embed_dim, c.grid(), true).reshape({1, len + 1, c.embed_dim}));
  decoder_pos_embed = register_buffer(
      "decoder_pos_embed",
      get_2d_sincos_pos_embed(c.decoder_embed_dim, c.grid(), true).reshape({1, len + 1, c.decoder_embed_dim}));
  patch_embed = register_module("patch_embed", nn::Linear(c.patch_dim(), c.embed_dim));
  blocks = register_module("blocks", nn::ModuleList());
  for (int64_t i = 0; i < c.depth; ++i) blocks->push_back(TransformerBlock(c.embed_dim, c.num_heads, c.mlp_ratio));
  norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({c.embed_dim}).eps(1e-6)));
  decoder_embed = register_module("decoder_embed", nn::Linear(c.embed_dim, c.decoder_embed_dim));
  decoder_blocks = register_module("decoder_blocks", nn::ModuleList());
  for (int64_t i = 0; i < c.decoder_depth; ++i)
    decoder_blocks->push_back(TransformerBlock(c.decoder_embed_dim, c.decoder_num_heads, c.mlp_ratio));
  decoder_norm = register_module("decoder_norm", nn::LayerNorm(nn::LayerNormOptions({c.decoder_embed_dim}).eps(1e-6)));
  decoder_pred = register_module("decoder_pred", nn::Linear(c.decoder_embed_dim, c.patch_dim()));

  // The reference's initialize_weights (MHA's in_proj is already xavier_uniform_).
  nn::init::normal_(cls_token, 0.0, 0.02);
  nn::init::normal_(mask_token, 0.0, 0.02);
  apply([](nn::Module& m) {
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(&m)) {
      nn::init::xavier_uniform_(linear->weight);
      if (linear->bias.defined()) nn::init::zeros_(linear->bias);
    }
  });
}

MAEEncoderOutput MAEImpl::forward_encoder(const Tensor& images, double mask_ratio, const Tensor& noise) {
  ND_CHECK(images.dim() == 4 && images.size(1) == 1 && images.size(2) == config.img_size &&
               images.size(3) == config.img_size,
           "MAE: expected images [N, 1, ", config.img_size, ", ", config.img_size, "], found ", images.describe());
  const int64_t n = images.size(0), len = config.num_patches();
  Tensor x = patch_embed(patchify(images, config.patch_size)) + pos_embed.slice(1, 1, len + 1);
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
  for (const auto& block : *blocks) x = block->forward(x);
  out.latent = norm(x);
  return out;
}

Tensor MAEImpl::forward_decoder(const Tensor& latent, const Tensor& ids_restore) {
  const int64_t n = latent.size(0), len = config.num_patches(), kept = latent.size(1) - 1;
  Tensor x = decoder_embed(latent);
  Tensor tokens = x.slice(1, 1, kept + 1);
  if (kept < len) tokens = cat({tokens, mask_token.expand({n, len - kept, config.decoder_embed_dim})}, 1);
  x = cat({x.slice(1, 0, 1), gather_tokens(tokens, ids_restore)}, 1) + decoder_pos_embed;
  for (const auto& block : *decoder_blocks) x = block->forward(x);
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

Tensor MAEImpl::features(const Tensor& images) {
  const int64_t len = config.num_patches();
  return forward_encoder(images, 0.0).latent.slice(1, 1, len + 1).mean({1});
}

}  // namespace nd::models
