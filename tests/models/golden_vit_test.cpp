// The MAE at the paper's full size against PyTorch, generated on the fly (nothing
// committed): `python3 tests/golden/make_models_golden.py --vit DIR` runs
// mae_vit_base_patch16_dec512d8b whole (batch 2) and ViT-L/16 and ViT-H/14 with 2 encoder
// and 2 decoder blocks (batch 1) in f64 on closed-form weights, images and masking noise
// (golden_record.h); here the same models in f32 give the same loss, predictions, mask,
// latent and every gradient, to 1e-4 of each tensor's scale (sampled large tensors and
// their norms). The whole ViT-B's state_dict is also checked against mae_keys.txt.
// Needs python3 with torch, numpy and safetensors (SKIPPED otherwise); label slow: the
// reference takes about a minute on two cores, our side about 30 s.
#include "golden_record.h"

using namespace nd;

TEST_CASE("golden: full ViT-B/16 MAE, and ViT-L/16 and ViT-H/14 with 2 blocks, against PyTorch (on the fly)") {
  if (!nd::testing::python_has_torch()) {
    MESSAGE("SKIPPED: python3 with torch, numpy and safetensors is not installed (pip install torch numpy safetensors)");
    return;
  }
  nd::testing::TempDir dir("golden_vit");
  const auto log = dir.path / "log.txt";
  REQUIRE_MESSAGE(nd::testing::run_python("tests/golden/make_models_golden.py", "--vit " + dir.path.string(), log) == 0,
                  "make_models_golden.py --vit failed: ", nd::testing::read_text(log));
  const TensorDict golden = load((dir.path / "vit.safetensors").string());

  {
    const models::MAEConfig c = models::MAEConfig::by_name("mae_vit_base_patch16_dec512d8b");
    models::MAE mae(c);
    std::map<std::string, std::string> keys;
    for (const auto& [k, v] : mae->state_dict()) keys[k] = nd::testing::shape_text(v.sizes());
    CHECK(keys == nd::testing::mae_reference_keys().at("mae_vit_base_patch16_dec512d8b"));
    nd::testing::check_mae_recorded(golden, "vit_b", mae, 2, 1e-4);
  }
  for (const auto& [name, config] : {std::pair{"vit_l2", "mae_vit_large_patch16_dec512d8b"},
                                     std::pair{"vit_h2", "mae_vit_huge_patch14_dec512d8b"}}) {
    CAPTURE(name);
    models::MAEConfig c = models::MAEConfig::by_name(config);
    c.depth = c.decoder_depth = 2;
    models::MAE mae(c);
    nd::testing::check_mae_recorded(golden, name, mae, 1, 1e-4);
  }
}
