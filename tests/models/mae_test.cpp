// MAE: names and counts as PyTorch's, sin-cos position embedding values, patchify (one
// and three channels) and the patch embedding's layout, the reference's init, per-sample
// masking (exactly int(49 * 0.25) = 12 visible tokens, ids_restore the
// inverse permutation), a loss that counts only masked patches, forward/backward, and
// checkpoint_activations giving the plain gradients bit for bit.
#include <algorithm>
#include <cmath>
#include <set>

#include "harness.h"

using namespace nd;
using models::MAEConfig;

namespace {

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : nd::testing::to_vector(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

}  // namespace

TEST_CASE("MAE: state_dict names and parameter counts are PyTorch's (tiny and small)") {
  models::MAE mae(MAEConfig::tiny());
  std::vector<std::string> names;
  for (const auto& [k, v] : mae->state_dict()) names.push_back(k);
  // From PyTorch (tests/golden/reference_models.py's MAE, models_mae.py's tree, with the
  // tiny config).
  std::vector<std::string> expected{"cls_token", "mask_token", "pos_embed", "decoder_pos_embed",
                                    "patch_embed.proj.weight", "patch_embed.proj.bias"};
  auto add_block = [&](const std::string& p) {
    for (const char* k : {"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                          "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                          "mlp.fc2.weight", "mlp.fc2.bias"})
      expected.push_back(p + k);
  };
  add_block("blocks.0.");
  add_block("blocks.1.");
  for (const char* k : {"norm.weight", "norm.bias", "decoder_embed.weight", "decoder_embed.bias"})
    expected.push_back(k);
  add_block("decoder_blocks.0.");
  for (const char* k : {"decoder_norm.weight", "decoder_norm.bias", "decoder_pred.weight", "decoder_pred.bias"})
    expected.push_back(k);
  std::sort(expected.begin(), expected.end());
  CHECK(names == expected);
  auto count = [](const nn::Module& m) {
    int64_t n = 0;
    for (const Tensor& p : m.parameters()) n += p.numel();
    return n;
  };
  CHECK(count(*mae) == 116656);  // PyTorch's count, as the next one
  CHECK(mae->state_dict().at("patch_embed.proj.weight").sizes() == Shape{64, 1, 4, 4});
  CHECK(mae->state_dict().at("blocks.1.attn.qkv.weight").sizes() == Shape{192, 64});
  CHECK(count(*models::MAE(MAEConfig::small())) == 2917072);
  // The position embeddings are buffers, not parameters (the reference's never train).
  for (const auto& [k, p] : mae->named_parameters()) CHECK(k.find("pos_embed") == std::string::npos);
  CHECK(mae->pos_embed.sizes() == Shape{1, 50, 64});
  CHECK(mae->decoder_pos_embed.sizes() == Shape{1, 50, 32});
  CHECK(MAEConfig::by_name("small").embed_dim == 192);
  CHECK(nd::testing::error_message([] { MAEConfig::by_name("huge"); }) ==
        "MAEConfig: unknown configuration 'huge' (expected tiny, small, mae_vit_base_patch16_dec512d8b, "
        "mae_vit_large_patch16_dec512d8b or mae_vit_huge_patch14_dec512d8b)");
}

TEST_CASE("MAE: 2-D sin-cos position embedding, known values (numpy reference)") {
  const Tensor pe = models::get_2d_sincos_pos_embed(16, 7, /*cls_token=*/true);
  CHECK(pe.sizes() == Shape{50, 16});
  nd::testing::check_close(pe.select(0, 0), std::vector<double>(16, 0.0), 0, 0, "cls row");
  // Token (0, 0): sin 0 = 0 and cos 0 = 1 in both halves.
  nd::testing::check_close(pe.select(0, 1), {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1}, 1e-7, 0, "token 0");
  // Token 9 = row 1, column 2: the first half encodes the column, the second the row
  // (MAE's get_2d_sincos_pos_embed, printed by numpy).
  nd::testing::check_close(pe.select(0, 10),
                           {0.9092974268256817, 0.19866933079506122, 0.01999866669333308, 0.0019999986666669333,
                            -0.4161468365471424, 0.9800665778412416, 0.9998000066665778, 0.9999980000006666,
                            0.8414709848078965, 0.09983341664682815, 0.009999833334166664, 0.0009999998333333417,
                            0.5403023058681398, 0.9950041652780258, 0.9999500004166653, 0.9999995000000417},
                           1e-7, 0, "token 9");
  CHECK(models::get_2d_sincos_pos_embed(16, 7, false).sizes() == Shape{49, 16});
}

TEST_CASE("MAE: patchify keeps a pixel's channels together, and the patch embedding is a Linear on that layout") {
  // models_mae.py's 'nchpwq->nhwpqc': patch (h, w), then pixel (p, q), then channel c.
  const Tensor img = arange(2 * 3 * 8 * 8.0).reshape({2, 3, 8, 8});
  const Tensor patches = models::patchify(img, 4);
  CHECK(patches.sizes() == Shape{2, 4, 48});
  // Sample 1, patch 1 (rows 0..3, columns 4..7), pixel (0, 1) = column 5: channels 0, 1, 2.
  nd::testing::check_close(patches.select(0, 1).select(0, 1).slice(0, 3, 6), {192 + 5, 256 + 5, 320 + 5}, 0, 0,
                           "pixel (0, 1)");
  nd::testing::check_close(models::unpatchify(patches, 4, 3), img, 0, 0, "round trip");
  CHECK(nd::testing::error_message([&] { models::unpatchify(patches, 4); }) ==
        "unpatchify: expected patches [N, L, 16] (4x4 pixels of 1 channel(s)), found [cpu f32 [2, 4, 48]]");
  // The strided convolution is the Linear on those patches whose weight is proj.weight
  // [E, C, p, q] permuted to [E, p, q, C].
  manual_seed(4);
  models::PatchEmbed embed(3, 5, 4);
  const Tensor x = rand({2, 3, 8, 8});
  const Tensor w = embed->proj->weight.permute({0, 2, 3, 1}).reshape({5, 48});
  nd::testing::check_close(embed(x), nn::functional::linear(models::patchify(x, 4), w, embed->proj->bias), 1e-5, 1e-5,
                           "conv == linear on patches");
}

TEST_CASE("MAE: the reference's init (patch projection like a Linear, tokens N(0, 0.02), Linears xavier)") {
  manual_seed(9);
  models::MAE mae(MAEConfig::by_name("small"));
  const TensorDict sd = mae->state_dict();
  auto max_abs = [](const Tensor& t) { return t.abs().max().item(); };
  // xavier_uniform_ on the [E, C p p] view: bound sqrt(6 / (C p p + E)), not the
  // Conv2d's own fans (which count the receptive field twice).
  const double patch_bound = std::sqrt(6.0 / (16 + 192));
  CHECK(max_abs(sd.at("patch_embed.proj.weight")) <= patch_bound);
  CHECK(max_abs(sd.at("patch_embed.proj.weight")) > 0.95 * patch_bound);
  // Its bias keeps Conv2d's default, U(-1/sqrt(C p p), 1/sqrt(C p p)).
  CHECK(max_abs(sd.at("patch_embed.proj.bias")) <= 0.25);
  CHECK(max_abs(sd.at("patch_embed.proj.bias")) > 0.2);
  const double qkv_bound = std::sqrt(6.0 / (192 + 3 * 192));
  CHECK(max_abs(sd.at("blocks.3.attn.qkv.weight")) <= qkv_bound);
  CHECK(max_abs(sd.at("blocks.3.attn.qkv.weight")) > 0.95 * qkv_bound);
  CHECK(max_abs(sd.at("decoder_pred.weight")) > 0.95 * std::sqrt(6.0 / (96 + 16)));
  for (const auto& [k, v] : sd) {
    CAPTURE(k);
    if (k.ends_with(".bias") && k != "patch_embed.proj.bias") CHECK(max_abs(v) == 0);
    if (k.find("norm") != std::string::npos && k.ends_with(".weight")) CHECK(v.sub(1.0).abs().max().item() == 0);
  }
  for (const char* token : {"cls_token", "mask_token"}) {
    CAPTURE(token);
    const auto v = nd::testing::to_vector(sd.at(token));
    double ss = 0;
    for (double x : v) ss += x * x;
    CHECK(std::sqrt(ss / v.size()) == doctest::Approx(0.02).epsilon(0.25));
  }
}

TEST_CASE("MAE: patchify takes row-major 4x4 patches and unpatchify inverts it") {
  Tensor img = arange(2 * 28 * 28.0).reshape({2, 1, 28, 28});
  Tensor patches = models::patchify(img, 4);
  CHECK(patches.sizes() == Shape{2, 49, 16});
  // Patch 1 of image 0 = rows 0..3, columns 4..7.
  nd::testing::check_close(patches.select(0, 0).select(0, 1),
                           {4, 5, 6, 7, 32, 33, 34, 35, 60, 61, 62, 63, 88, 89, 90, 91}, 0, 0, "patch 1");
  // Patch 7 = rows 4..7, columns 0..3.
  CHECK(patches.select(0, 0).select(0, 7).select(0, 0).item() == 4 * 28);
  nd::testing::check_close(models::unpatchify(patches, 4), img, 0, 0, "round trip");
}

TEST_CASE("MAE: random masking keeps exactly 12 of 49 tokens per sample, the lowest-noise ones") {
  Generator g{5, 0};
  const Tensor noise = rand({6, 49}, kFloat32, &g);
  const models::Masking m = models::random_masking(noise, 0.75);
  CHECK(m.ids_keep.sizes() == Shape{6, 12});
  CHECK(m.ids_restore.sizes() == Shape{6, 49});
  const auto keep = ints(m.ids_keep), restore = ints(m.ids_restore);
  const auto mask = nd::testing::to_vector(m.mask), nv = nd::testing::to_vector(noise);
  for (int64_t b = 0; b < 6; ++b) {
    CAPTURE(b);
    const std::set<int64_t> kept(keep.begin() + b * 12, keep.begin() + (b + 1) * 12);
    CHECK(kept.size() == 12);
    // Kept = the 12 smallest noise values, in ascending noise order.
    std::vector<int64_t> order(49);
    for (int64_t l = 0; l < 49; ++l) order[l] = l;
    std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return nv[b * 49 + x] < nv[b * 49 + y]; });
    CHECK(std::vector<int64_t>(keep.begin() + b * 12, keep.begin() + (b + 1) * 12) ==
          std::vector<int64_t>(order.begin(), order.begin() + 12));
    double masked = 0;
    for (int64_t l = 0; l < 49; ++l) {
      // ids_restore is the inverse of the shuffle: order[restore[l]] == l.
      CHECK(order[restore[b * 49 + l]] == l);
      CHECK(mask[b * 49 + l] == (kept.count(l) ? 0.0 : 1.0));
      masked += mask[b * 49 + l];
    }
    CHECK(masked == 37);
  }
  // The encoder sees cls + 12 tokens.
  models::MAE mae(MAEConfig::tiny());
  const auto enc = mae->forward_encoder(randn({6, 1, 28, 28}), 0.75, noise);
  CHECK(enc.latent.sizes() == Shape{6, 13, 64});
  nd::testing::check_close(enc.mask, m.mask, 0, 0, "encoder mask");
  CHECK(ints(enc.ids_restore) == restore);
}

TEST_CASE("MAE: gather_tokens picks rows per sample and passes gradients back (gradcheck)") {
  const Tensor ids = tensor({2, 0, 1, 1}, kInt64).reshape({2, 2});
  const Tensor x = arange(2 * 3 * 2.0).reshape({2, 3, 2});
  nd::testing::check_close(models::gather_tokens(x, ids), {4, 5, 0, 1, 8, 9, 8, 9}, 0, 0, "gather");
  nd::testing::gradcheck("gather_tokens",
                         [&](const std::vector<Tensor>& in) { return models::gather_tokens(in[0], ids); },
                         {nd::testing::random_input({2, 3, 2}, 1).requires_grad_(true)});
}

TEST_CASE("MAE: the loss counts masked patches only, on per-patch normalised pixels") {
  models::MAE mae(MAEConfig::tiny());
  Generator g{3, 0};
  const Tensor images = rand({2, 1, 28, 28}, kFloat32, &g) * 2 - 1;
  const Tensor noise = rand({2, 49}, kFloat32, &g);
  const models::Masking m = models::random_masking(noise, 0.75);
  Tensor target = models::patchify(images, 4);
  target = (target - target.mean({-1}, true)) / (target.var({-1}, 1, true) + 1e-6).sqrt();
  // Exact on masked patches, far off on visible ones: zero loss.
  const Tensor mask3 = m.mask.unsqueeze(2);
  const Tensor pred = target * mask3 + (1 - mask3) * 100.0;
  CHECK(mae->forward_loss(images, pred, m.mask).item() == doctest::Approx(0.0).epsilon(1e-6));
  // Off by 1 everywhere: loss 1.
  CHECK(mae->forward_loss(images, target + 1.0, m.mask).item() == doctest::Approx(1.0).epsilon(1e-5));
  // Off by 2 on a single masked patch of sample 0 only: 4 / 74 masked patches.
  int64_t first_masked = 0;
  while (m.mask.select(0, 0).select(0, first_masked).item() == 0) ++first_masked;
  Tensor off = zeros({2, 49, 16});
  off.select(0, 0).select(0, first_masked).fill_(2.0);
  CHECK(mae->forward_loss(images, target + off, m.mask).item() == doctest::Approx(4.0 / 74).epsilon(1e-5));
}

TEST_CASE("MAE: forward and backward reach every parameter, and features for probes") {
  manual_seed(2);
  models::MAE mae(MAEConfig::tiny());
  const Tensor images = rand({3, 1, 28, 28}) * 2 - 1;
  const models::MAEOutput out = mae(images);
  CHECK(out.loss.dim() == 0);
  CHECK(out.pred.sizes() == Shape{3, 49, 16});
  CHECK(out.mask.sizes() == Shape{3, 49});
  CHECK(out.mask.sum().item() == 3 * 37);
  CHECK(out.loss.item() > 0.5);  // an untrained decoder is far from the normalised pixels
  out.loss.backward();
  for (const auto& [name, p] : mae->named_parameters()) {
    CAPTURE(name);
    CHECK(p.grad().abs().sum().item() > 0);
  }
  // Same seed, same masking.
  manual_seed(2);
  models::MAE again(MAEConfig::tiny());
  nd::testing::check_close(again(rand({3, 1, 28, 28}) * 2 - 1).mask, out.mask, 0, 0, "seeded mask");
  {
    NoGradGuard no_grad;
    const Tensor f = mae->features(images);
    CHECK(f.sizes() == Shape{3, 64});
    // No masking: every token in order; the features are the mean of the encoder's patch tokens.
    const auto enc = mae->forward_encoder(images, 0.0);
    CHECK(enc.latent.sizes() == Shape{3, 50, 64});
    CHECK(enc.mask.sum().item() == 0);
    nd::testing::check_close(f, enc.latent.slice(1, 1, 50).mean({1}), 1e-6, 1e-6, "features");
  }
  CHECK(nd::testing::error_message([&] { mae(zeros({2, 1, 32, 32})); }).find("expected images [N, 1, 28, 28]") !=
        std::string::npos);
}

TEST_CASE("MAE: checkpoint_activations gives the loss and every gradient of the plain model, bit for bit (f64)") {
  std::vector<Tensor> grads[2];
  Tensor losses[2];
  for (bool checkpointed : {false, true}) {
    MAEConfig config = MAEConfig::tiny();
    config.checkpoint_activations = checkpointed;
    manual_seed(4);
    models::MAE mae(config);
    mae->to(kFloat64);
    const Tensor images = rand({2, 1, 28, 28}, kFloat64) * 2 - 1;
    const models::MAEOutput out = mae(images);  // the masking noise drawn after the same seed
    out.loss.backward();
    losses[checkpointed] = out.loss;
    for (const auto& [name, p] : mae->named_parameters()) grads[checkpointed].push_back(p.grad());
  }
  CHECK(nd::testing::bitwise_equal(losses[0], losses[1]));
  REQUIRE(grads[0].size() == grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    CAPTURE(i);
    CHECK(nd::testing::bitwise_equal(grads[0][i], grads[1][i]));
  }
}

TEST_CASE("MAE: checkpoint_activations lowers the peak of CPU memory in a training step") {
  int64_t peak[2];
  for (bool checkpointed : {false, true}) {
    MAEConfig config = MAEConfig::tiny();
    config.depth = 6;
    config.checkpoint_activations = checkpointed;
    manual_seed(4);
    models::MAE mae(config);
    const Tensor images = rand({32, 1, 28, 28});
    cpu::reset_peak_memory_stats();
    const int64_t before = cpu::memory_stats().allocated_bytes;
    mae(images).loss.backward();
    peak[checkpointed] = cpu::memory_stats().peak_allocated_bytes - before;
  }
  MESSAGE("peak above the model: ", peak[0], " B plain, ", peak[1], " B checkpointed");
  // Six encoder blocks keep [32, 13, 64] activations (about 40 of them each) without it.
  CHECK(peak[1] < 0.7 * peak[0]);
}
