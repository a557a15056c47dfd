// The apps' model selection (apps/common/model_select.h): --model naming the default
// config changes nothing, bit for bit; a config for other images than the data's is one
// clear error naming both; unknown names and train_joint's ViTs are usage errors;
// --checkpoint-activations gives the run without it, bit for bit; --init-from loads a
// whole MAE or its encoder (the seed then no longer matters) and names a bad file's keys,
// and loads a reference MAE's .pth converted by models/mae_pth_to_safetensors.py (python3
// with torch; SKIPPED without); metrics.jsonl carries the allocator's peak; a ViT-B MAE
// trains end to end on a folder of images at 224x224, alone and on 2 ranks. --paper-recipe:
// train_mae's parameter groups against the reference's rule applied to the checkpoint's
// names, each group's betas and weight decay in the checkpoint, the lr each step used
// (blr x batch / 256 at the end of warmup, --blr, --lr), --zero on 2 ranks equal to 1 rank
// and resumed at 1 rank; train_gan's equal to its defaults; the bad combinations and a
// resume with the other setting as one line each.
#include <string>

#include "apps/app_runner.h"
#include "data/data_test_util.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing;

namespace {
std::string tiny(const fs::path& out) {
  return "--steps 2 --batch-size 8 --log-every 2 --sample-every 1000 --ckpt-every 2 --out " + out.string();
}

// Where the number after "key": starts in a metrics line, or npos.
size_t number_at(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  return at == std::string::npos ? at : at + key.size() + 3;
}

// The number after "key": in the first metrics line that has it.
double first_metric(const fs::path& out, const std::string& key) {
  for (const std::string& line : read_lines(out / "metrics.jsonl")) {
    const size_t at = number_at(line, key);
    if (at != std::string::npos) return std::stod(line.substr(at));
  }
  FAIL("no " << key << " in " << (out / "metrics.jsonl").string());
  return 0;
}

// The number after "key": in metrics.jsonl's line of training step `step`.
double metric_at(const fs::path& out, int64_t step, const std::string& key) {
  for (const std::string& line : read_lines(out / "metrics.jsonl"))
    if (contains(line, "{\"step\":" + std::to_string(step) + ",\"loss\"")) {
      const size_t at = number_at(line, key);
      REQUIRE(at != std::string::npos);
      return std::stod(line.substr(at));
    }
  FAIL("no training line of step " << step << " in " << (out / "metrics.jsonl").string());
  return 0;
}

// A one-line failure with this status and this text.
void check_fails(const Run& r, int status, const std::string& text) {
  INFO(r.output);
  CHECK(r.status == status);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  CHECK(contains(r.output, text));
}
// `app` on the tiny settings without and with `flag`, one OpenMP thread each (the CPU
// runs are then bit for bit repeatable); the second run's output.
struct TwoRuns {
  fs::path plain, flagged;
  std::string output;
};
TwoRuns without_and_with(const std::string& app, const std::string& flag) {
  TwoRuns t{temp_dir(app + "_plain"), temp_dir(app + "_flagged"), ""};
  REQUIRE(run_app(app, tiny(t.plain), "OMP_NUM_THREADS=1").status == 0);
  const Run r = run_app(app, tiny(t.flagged) + " " + flag, "OMP_NUM_THREADS=1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  check_same_models(t.plain / "ckpt" / "latest.safetensors", t.flagged / "ckpt" / "latest.safetensors", 0);
  t.output = r.output;
  return t;
}
}  // namespace

TEST_CASE("apps --model: naming the data's default config changes nothing, a config for other images is an error") {
  const TwoRuns gan = without_and_with("train_gan", "--model dcgan28");
  CHECK(contains(gan.output, "model dcgan28, nz 64, ngf 32, ndf 32"));
  CHECK(first_metric(gan.flagged, "peak_mem_bytes") > 1.8e8);  // the dataset alone is 188 MB of f32

  check_fails(run_app("train_gan", tiny(temp_dir("gan64")) + " --model dcgan64"), 1,
              "train_gan: error: --model dcgan64 takes 64x64x3 images; the data's are 28x28x1");
  check_fails(run_app("train_gan", tiny(temp_dir("gan99")) + " --model dcgan99"), 2,
              "train_gan: --model expects dcgan28, dcgan32 or dcgan64, got 'dcgan99'");
  check_fails(run_app("train_mae", tiny(temp_dir("vit")) + " --model mae_vit_base_patch16_dec512d8b"), 1,
              "train_mae: error: --model mae_vit_base_patch16_dec512d8b takes 224x224x3 images; the data's are "
              "28x28x1");
  check_fails(run_app("train_mae", tiny(temp_dir("big")) + " --model big"), 2,
              "train_mae: --model expects tiny, small, mae_vit_base_patch16_dec512d8b, "
              "mae_vit_large_patch16_dec512d8b or mae_vit_huge_patch14_dec512d8b, got 'big'");
  check_fails(run_app("train_joint", tiny(temp_dir("joint")) + " --model mae_vit_huge_patch14_dec512d8b"), 2,
              "train_joint: --model mae_vit_huge_patch14_dec512d8b: train_joint's MAE reconstructs its DCGAN's 28x28 "
              "images; expected tiny or small");
  check_fails(run_app("train_joint", tiny(temp_dir("joint2")) + " --model big"), 2,
              "train_joint: --model expects tiny or small, got 'big'");
}

TEST_CASE("apps --checkpoint-activations: train_mae's losses and weights are those of the run without it") {
  const TwoRuns mae = without_and_with("train_mae", "--checkpoint-activations");
  CHECK(contains(mae.output, "activation checkpointing"));
  CHECK(first_metric(mae.flagged, "loss") == first_metric(mae.plain, "loss"));
  CHECK(first_metric(mae.flagged, "test_loss") == first_metric(mae.plain, "test_loss"));
}

TEST_CASE("apps --init-from: a whole MAE or its encoder, and a file of another config named") {
  manual_seed(99);
  models::MAE source(models::MAEConfig::tiny());
  const fs::path files = temp_dir("init_files");
  save(source->state_dict(), (files / "mae_tiny.safetensors").string());
  TensorDict encoder;
  for (const auto& [key, value] : source->state_dict())
    if (!models::MAEEncoderImpl::is_decoder_key(key)) encoder[key] = value;
  save(encoder, (files / "encoder_tiny.safetensors").string());
  manual_seed(99);
  models::MAE other(models::MAEConfig::small());
  save(other->state_dict(), (files / "mae_small.safetensors").string());

  // --steps 0 evaluates the starting weights: with --init-from the seed's init no longer
  // matters, without it it does.
  auto test_loss = [&](const std::string& name, const std::string& args) {
    const fs::path out = temp_dir(name);
    const Run r = run_app("train_mae", "--steps 0 --sample-every 1000 --out " + out.string() + " " + args,
                          "OMP_NUM_THREADS=1");
    INFO(r.output);
    REQUIRE(r.status == 0);
    return std::pair{first_metric(out, "test_loss"), r.output};
  };
  const std::string whole = "--init-from " + (files / "mae_tiny.safetensors").string();
  const auto [a, log_a] = test_loss("init_a", whole + " --seed 1");
  const auto [b, log_b] = test_loss("init_b", whole + " --seed 2");
  CHECK(a == b);
  CHECK(contains(log_a, "train_mae: initialised the encoder and decoder from "));
  CHECK(test_loss("seed_1", "--seed 1").first != test_loss("seed_2", "--seed 2").first);
  const std::string enc = "--init-from " + (files / "encoder_tiny.safetensors").string();
  const auto [e1, log_e] = test_loss("enc_1", enc + " --seed 1");
  CHECK(contains(log_e, "train_mae: initialised the encoder from "));
  CHECK(contains(log_e, "(no decoder keys: the decoder keeps its init)"));
  CHECK(e1 != a);  // the decoder is the seed's

  const Run bad = run_app("train_mae", "--steps 0 --out " + temp_dir("bad").string() + " --init-from " +
                                           (files / "mae_small.safetensors").string());
  check_fails(bad, 1, "train_mae: error: --init-from " + (files / "mae_small.safetensors").string() + ": ");
  CHECK(contains(bad.output, "cls_token"));
  check_fails(run_app("train_mae", "--steps 0 --out " + temp_dir("none").string() + " --init-from " +
                                       (files / "nothing.safetensors").string()),
              1, "nothing.safetensors");
}

TEST_CASE("apps --init-from: a reference tiny MAE's .pth converted by models/mae_pth_to_safetensors.py") {
  if (std::system("python3 -c 'import torch, numpy, safetensors' > /dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED: python3 with torch, numpy and safetensors is not installed (pip install torch numpy safetensors)");
    return;
  }
  // tests/golden/reference_models.py's MaskedAutoencoderViT at the tiny config, PyTorch's
  // own init, saved as main_pretrain.py saves its checkpoints ({"model": state_dict}).
  const fs::path dir = temp_dir("pth"), source = NANODDP_SOURCE_DIR;
  const std::string pth = (dir / "tiny.pth").string(), converted = (dir / "tiny.safetensors").string();
  const std::string make =
      "import sys; sys.path.insert(0, '" + (source / "tests" / "golden").string() + "'); import torch; "
      "from reference_models import MAE; torch.manual_seed(0); "
      "m = MAE(embed_dim=64, depth=2, num_heads=4, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4); "
      "torch.save({'model': m.state_dict()}, '" + pth + "')";
  const Run made = run_logged("python3 -c \"" + make + "\"", dir / "make.log");
  INFO(made.output);
  REQUIRE(made.status == 0);
  const Run conv = run_logged("python3 " + (source / "models" / "mae_pth_to_safetensors.py").string() + " " + pth +
                                  " " + converted,
                              dir / "convert.log");
  INFO(conv.output);
  REQUIRE(conv.status == 0);
  double losses[2];
  for (int seed : {1, 2}) {
    const fs::path out = temp_dir("pth_run" + std::to_string(seed));
    const Run r = run_app("train_mae", "--steps 0 --sample-every 1000 --seed " + std::to_string(seed) + " --out " +
                                           out.string() + " --init-from " + converted,
                          "OMP_NUM_THREADS=1");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(contains(r.output, "train_mae: initialised the encoder and decoder from " + converted));
    losses[seed - 1] = first_metric(out, "test_loss");
  }
  CHECK(losses[0] == losses[1]);
}

TEST_CASE("apps: train_mae trains the paper's ViT-B MAE on a folder at 224x224, 2 ranks equal 1 rank") {
  if (mpirun_missing()) return;
  // 8 PNGs and JPEGs (20-40 px, upscaled to 224) in 2 classes; global batch 2: one image
  // a rank on 2 ranks. 2 steps of the full-size model: about 45 s of CPU for both runs.
  const fs::path images = temp_dir("vit_images");
  make_image_folder(images, 6);
  const std::string args = "--data " + images.string() +
                           " --image-size 224 --workers 2 --batch-size 2 --steps 2 --log-every 1 "
                           "--sample-every 1000 --ckpt-every 1000 --no-tensorboard --out ";
  const fs::path single = temp_dir("vit_single"), multi = temp_dir("vit_multi");
  const Run s = run_app("train_mae", args + single.string(), "OMP_NUM_THREADS=1");
  INFO(s.output);
  REQUIRE(s.status == 0);
  CHECK(contains(s.output, "ImageFolder in " + images.string() + " (8 images, 2 classes) at 224x224x3"));
  CHECK(contains(s.output, "mae_vit_base_patch16_dec512d8b"));
  const Run m = run_logged("env OMP_NUM_THREADS=1 mpirun " + mpirun_test_options() + " -np 2 " +
                               (apps_dir() / "train_mae").string() + " " + args + multi.string(),
                           temp_dir("logs") / "vit_multi.log");
  INFO(m.output);
  REQUIRE(m.status == 0);

  // The state_dict of facebookresearch/mae's mae_vit_base_patch16_dec512d8b.
  const TensorDict weights = load((multi / "ckpt" / "latest.safetensors").string());
  CHECK(weights.at("model.MAE.patch_embed.proj.weight").sizes() == Shape{768, 3, 16, 16});
  CHECK(weights.at("model.MAE.blocks.11.attn.qkv.weight").sizes() == Shape{2304, 768});
  CHECK(weights.at("model.MAE.decoder_blocks.7.mlp.fc1.weight").sizes() == Shape{2048, 512});
  CHECK(weights.at("model.MAE.decoder_pred.weight").sizes() == Shape{768, 512});
  CHECK(weights.at("model.MAE.pos_embed").sizes() == Shape{1, 197, 768});

  // The same global batches, masks and updates: the same losses and weights.
  REQUIRE(read_lines(single / "metrics.jsonl").size() == read_lines(multi / "metrics.jsonl").size());
  for (int64_t step = 1; step <= 2; ++step)
    CHECK(metric_at(multi, step, "loss") == doctest::Approx(metric_at(single, step, "loss")).epsilon(1e-5));
  check_same_models(single / "ckpt" / "latest.safetensors", multi / "ckpt" / "latest.safetensors", 1e-4);
}

namespace {
// train_mae --paper-recipe, 4 steps of global batch 8, 2 of warmup, a metrics line a step.
std::string recipe_args(const fs::path& out) {
  return "--paper-recipe --steps 4 --warmup 2 --batch-size 8 --log-every 1 --sample-every 1000 --ckpt-every 2 "
         "--no-tensorboard --out " +
         out.string();
}
}  // namespace

TEST_CASE("apps --paper-recipe: train_mae's groups, betas and weight decay in the checkpoint, the lr it steps with") {
  const fs::path out = temp_dir("recipe");
  const Run r = run_app("train_mae", recipe_args(out), "OMP_NUM_THREADS=1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const TensorDict ckpt = load((out / "ckpt" / "latest.safetensors").string());

  // The reference's rule (timm's add_weight_decay over main_pretrain.py's model) applied
  // to the checkpoint's parameters by name: the fixed position embeddings are not trained,
  // a 1-D tensor or a ".bias" is not decayed, every other one (cls_token and mask_token
  // included) is. The optimizer numbers its state group 0 (no decay) first.
  std::vector<std::string> no_decay, decay;
  for (const auto& [key, value] : ckpt) {
    if (key.rfind("model.MAE.", 0) != 0 || contains(key, "pos_embed")) continue;
    (value.dim() == 1 || key.ends_with(".bias") ? no_decay : decay).push_back(key);
  }
  CHECK(no_decay.size() == 31);
  CHECK(decay.size() == 17);
  CHECK(std::count(decay.begin(), decay.end(), "model.MAE.cls_token") == 1);
  CHECK(std::count(decay.begin(), decay.end(), "model.MAE.mask_token") == 1);
  CHECK(contains(r.output, "train_mae: the paper's recipe: AdamW lr 4.6875e-06 (blr 0.00015 x global batch 8 / 256), "
                           "betas (0.9, 0.95), weight decay 0 on 31 tensors and 0.05 on 17 tensors (none on 1-D "
                           "parameters and biases); warmup 2 steps from lr 0, then a cosine to 0; norm_pix_loss on"));
  for (size_t k = 0; k < no_decay.size() + decay.size(); ++k)
    CHECK((ckpt.at("optim.MAE.state." + std::to_string(k) + ".exp_avg").dim() == 1) == (k < no_decay.size()));
  CHECK(!ckpt.count("optim.MAE.state." + std::to_string(no_decay.size() + decay.size()) + ".exp_avg"));
  for (int g = 0; g < 2; ++g) {
    const std::string group = "optim.MAE.param_groups." + std::to_string(g) + ".";
    CHECK(ckpt.at(group + "beta1").item() == 0.9);
    CHECK(ckpt.at(group + "beta2").item() == 0.95);
    CHECK(ckpt.at(group + "weight_decay").item() == (g == 0 ? 0.0 : 0.05));
  }
  CHECK(!ckpt.count("optim.MAE.param_groups.2.lr"));

  // util/lr_sched.py per step: 0, half, blr x 8 / 256 at the end of warmup, then the cosine.
  const double lr = 1.5e-4 * 8 / 256;
  CHECK(metric_at(out, 1, "lr") == 0);
  CHECK(metric_at(out, 2, "lr") == doctest::Approx(lr / 2).epsilon(1e-8));
  CHECK(metric_at(out, 3, "lr") == doctest::Approx(lr).epsilon(1e-8));
  CHECK(metric_at(out, 4, "lr") == doctest::Approx(lr / 2).epsilon(1e-8));

  // --blr scales with the global batch; --lr is the lr itself.
  const fs::path blr = temp_dir("recipe_blr"), abs = temp_dir("recipe_lr");
  const Run b = run_app("train_mae", recipe_args(blr) + " --blr 3e-4 --batch-size 16", "OMP_NUM_THREADS=1");
  INFO(b.output);
  REQUIRE(b.status == 0);
  CHECK(contains(b.output, "AdamW lr 1.875e-05 (blr 0.0003 x global batch 16 / 256)"));
  CHECK(metric_at(blr, 3, "lr") == doctest::Approx(3e-4 * 16 / 256).epsilon(1e-8));
  const Run a = run_app("train_mae", recipe_args(abs) + " --lr 1e-3", "OMP_NUM_THREADS=1");
  INFO(a.output);
  REQUIRE(a.status == 0);
  CHECK(contains(a.output, "AdamW lr 0.001 (--lr)"));
  CHECK(metric_at(abs, 3, "lr") == doctest::Approx(1e-3).epsilon(1e-8));
}

TEST_CASE("apps --paper-recipe: train_mae under --zero on 2 ranks equals 1 rank, and resumes at 1 rank without it") {
  if (mpirun_missing()) return;
  const fs::path single = temp_dir("recipe_single"), zero = temp_dir("recipe_zero");
  const Run s = run_app("train_mae", recipe_args(single), "OMP_NUM_THREADS=1");
  INFO(s.output);
  REQUIRE(s.status == 0);
  const Run z = run_logged("env OMP_NUM_THREADS=1 mpirun " + mpirun_test_options() + " -np 2 " +
                               (apps_dir() / "train_mae").string() + " " + recipe_args(zero) + " --zero",
                           temp_dir("logs") / "recipe_zero.log");
  INFO(z.output);
  REQUIRE(z.status == 0);
  for (int64_t step = 1; step <= 4; ++step) {
    CHECK(metric_at(zero, step, "loss") == doctest::Approx(metric_at(single, step, "loss")).epsilon(1e-5));
    CHECK(metric_at(zero, step, "lr") == metric_at(single, step, "lr"));
  }
  check_same_models(single / "ckpt" / "latest.safetensors", zero / "ckpt" / "latest.safetensors", 1e-5);
  // ZeRO's checkpoint holds the whole state in the plain optimizer's layout, groups included.
  const TensorDict a = load((single / "ckpt" / "latest.safetensors").string());
  const TensorDict b = load((zero / "ckpt" / "latest.safetensors").string());
  for (const auto& [key, value] : a)
    if (key.rfind("optim.MAE.", 0) == 0) {
      REQUIRE(b.count(key));
      check_close(b.at(key), value, 1e-5, 1e-5, key);
    }
  const Run resumed = run_app("train_mae", recipe_args(zero) + " --steps 6 --resume", "OMP_NUM_THREADS=1");
  INFO(resumed.output);
  CHECK(resumed.status == 0);
  CHECK(metric_at(zero, 6, "lr") == doctest::Approx(1.5e-4 * 8 / 256 * 0.5 * (1 + std::cos(M_PI * 3 / 4))));
}

TEST_CASE("apps --paper-recipe: train_gan's is its defaults, bad combinations are one line") {
  const TwoRuns gan = without_and_with("train_gan", "--paper-recipe");
  CHECK(contains(gan.output, "train_gan: the paper's recipe: Adam lr 0.0002, betas (0.5, 0.999) for G and D"));

  check_fails(run_app("train_gan", tiny(temp_dir("gan_lr")) + " --paper-recipe --lr 1e-3"), 2,
              "train_gan: --paper-recipe and --lr cannot be combined: the DCGAN paper's lr is 2e-4");
  check_fails(run_app("train_mae", tiny(temp_dir("blr")) + " --blr 3e-4"), 2,
              "train_mae: --blr needs --paper-recipe (without it, --lr is the learning rate)");
  check_fails(run_app("train_mae", tiny(temp_dir("blr_lr")) + " --paper-recipe --blr 3e-4 --lr 1e-3"), 2,
              "train_mae: --lr and --blr cannot be combined: --lr is the learning rate, --blr the base one (lr = blr "
              "x global batch / 256)");
  check_fails(run_app("train_mae", tiny(temp_dir("blr0")) + " --paper-recipe --blr 0"), 2,
              "train_mae: --blr expects");

  // A resume with the other setting: the optimizer's groups and schedule would differ.
  const fs::path out = temp_dir("recipe_resume");
  REQUIRE(run_app("train_mae", recipe_args(out), "OMP_NUM_THREADS=1").status == 0);
  const std::string ckpt = (out / "ckpt" / "latest.safetensors").string();
  check_fails(run_app("train_mae", tiny(out) + " --steps 6 --resume"), 1,
              "train_mae: error: --resume: " + ckpt +
                  " was trained with --paper-recipe on, this run has --paper-recipe off; use the same setting");
  const fs::path plain = temp_dir("plain_resume");
  REQUIRE(run_app("train_mae", tiny(plain), "OMP_NUM_THREADS=1").status == 0);
  check_fails(run_app("train_mae", tiny(plain) + " --steps 4 --paper-recipe --resume"), 1,
              "train_mae: error: --resume: " + (plain / "ckpt" / "latest.safetensors").string() +
                  " was trained with --paper-recipe off, this run has --paper-recipe on; use the same setting");
}
