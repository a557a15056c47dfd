// models/mae_pth_to_safetensors.py on checkpoints a reference MAE wrote: `python3
// tests/golden/make_models_golden.py --pth DIR` saves the ViT-config twin (32x32x3, 8x8
// patches, E 64, depth 2; Ed 32) with PyTorch's own init as main_pretrain.py does
// ({"model", "optimizer", "epoch", "scaler", "args"}), its encoder's keys alone as the
// released pretrain checkpoints hold them, and the loss and unmasked latent of those
// weights (f64). The converted files load with strict=true into MAE (same loss) and
// through MAEEncoder::load_encoder_state_dict (same latent); the tool's errors are
// checked too. Needs python3 with torch, numpy and safetensors (SKIPPED otherwise).
#include "golden_record.h"

using namespace nd;
using nd::testing::read_text;
using nd::testing::run_python;

namespace {

const char* kTool = "models/mae_pth_to_safetensors.py";

models::MAEConfig twin() {
  models::MAEConfig c;
  c.img_size = 32, c.patch_size = 8, c.in_chans = 3;
  c.embed_dim = 64, c.depth = 2, c.num_heads = 4;
  c.decoder_embed_dim = 32, c.decoder_depth = 1, c.decoder_num_heads = 4;
  return c;
}

}  // namespace

TEST_CASE("mae_pth_to_safetensors: a reference checkpoint loads strictly and gives the reference's loss, the encoder alone from the same file") {
  if (!nd::testing::python_has_torch()) {
    MESSAGE("SKIPPED: python3 with torch, numpy and safetensors is not installed (pip install torch numpy safetensors)");
    return;
  }
  nd::testing::TempDir dir("mae_pth");
  const auto file = [&](const char* name) { return (dir.path / name).string(); };
  const auto log = dir.path / "log.txt";
  REQUIRE_MESSAGE(run_python("tests/golden/make_models_golden.py", "--pth " + dir.path.string(), log) == 0,
                  read_text(log));
  const TensorDict expected = load(file("expected.safetensors"));

  REQUIRE_MESSAGE(run_python(kTool, file("mae_twin.pth") + " " + file("mae_twin.safetensors"), log) == 0,
                  read_text(log));
  CHECK(read_text(log) == file("mae_twin.safetensors") +
                              ": 50 tensors, patch 8, embed_dim 64, depth 2 (encoder and decoder)\n");
  const TensorDict full = load(file("mae_twin.safetensors"));
  models::MAE mae(twin());
  mae->load_state_dict(full);  // strict
  NoGradGuard no_grad;
  const Tensor loss = mae(expected.at("images"), expected.at("noise")).loss;
  CHECK(loss.item() == doctest::Approx(expected.at("loss").item()).epsilon(1e-5));
  // The encoder alone, from the same file (the decoder's keys passed over).
  models::MAEEncoder encoder(twin());
  encoder->load_encoder_state_dict(full);
  nd::testing::check_close_scaled(encoder->forward_encoder(expected.at("images"), 0.0).latent, expected.at("latent"),
                                  1e-5, "encoder latent");

  // An encoder-only checkpoint (the released pretrain files): MAEEncoder loads it, a
  // strict MAE load names the decoder's keys as missing.
  REQUIRE_MESSAGE(run_python(kTool, file("mae_twin_encoder.pth") + " " + file("encoder.safetensors"), log) == 0,
                  read_text(log));
  CHECK(read_text(log).find("30 tensors, patch 8, embed_dim 64, depth 2 (encoder only)") != std::string::npos);
  const TensorDict encoder_only = load(file("encoder.safetensors"));
  models::MAEEncoder probe(twin());
  probe->load_encoder_state_dict(encoder_only);
  nd::testing::check_close_scaled(probe->features(expected.at("images")),
                                  expected.at("latent").slice(1, 1, 17).mean({1}), 1e-5, "probe features");
  models::MAE fresh(twin());
  CHECK(nd::testing::error_message([&] { fresh->load_state_dict(encoder_only); }).find(
            "Missing key(s): \"decoder_blocks.0.attn.proj.bias\"") != std::string::npos);

  // Bad inputs: exit status 1 and one line saying why.
  CHECK(run_python(kTool, file("missing.pth") + " " + file("x.safetensors"), log) == 1);
  CHECK(read_text(log) == "mae_pth_to_safetensors: " + file("missing.pth") + ": no such file\n");
  CHECK(run_python(kTool, file("no_model.pth") + " " + file("x.safetensors"), log) == 1);
  CHECK(read_text(log) == "mae_pth_to_safetensors: " + file("no_model.pth") +
                              " holds no state dict of tensors (expected a dict with a 'model' state dict, found "
                              "['epoch'])\n");
  std::ofstream(file("junk.pth")) << "not a checkpoint";
  CHECK(run_python(kTool, file("junk.pth") + " " + file("x.safetensors"), log) == 1);
  CHECK(read_text(log).rfind("mae_pth_to_safetensors: cannot read " + file("junk.pth") + " as a PyTorch checkpoint", 0) ==
        0);
}
