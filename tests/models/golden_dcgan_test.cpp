// DCGAN at full size against PyTorch: tests/golden/make_models_golden.py ran
// examples/dcgan's Generator and Discriminator (dcgan64, layer for layer, Sigmoid
// included) and the 32x32 variant (dcgan32) in f64 on closed-form weights and inputs
// (golden_record.h), batch 2, train mode, and recorded outputs, losses, BatchNorm running
// statistics and every gradient (large tensors as every stride-th value plus the norm of
// all) in tests/golden/models_full.safetensors. Here the same weights give the same
// results in f32, to 1e-4 of each tensor's scale.
#include "golden_record.h"

using namespace nd;
using nd::testing::check_recorded;
using nd::testing::closed_form_uniform;

namespace {

void check_dcgan(const std::string& name, bool sigmoid) {
  const TensorDict golden = nd::testing::load_golden("models_full.safetensors");
  const models::DCGANConfig c = models::DCGANConfig::by_name(name);
  const int64_t s = c.image_size;

  models::DCGANGenerator G(c);
  nd::testing::fill_closed_form(*G);
  const Tensor fake = G(closed_form_uniform("z", {2, c.nz}, -2, 2));
  const Tensor loss_g = (fake * closed_form_uniform("grad_out", {2, c.nc, s, s}, -1, 1)).sum();
  loss_g.backward();
  check_recorded(golden, name + ".G.out.fake", fake, 1e-4);
  check_recorded(golden, name + ".G.out.loss", loss_g, 1e-4);
  for (const auto& [k, p] : G->named_parameters()) check_recorded(golden, name + ".G.grad." + k, p.grad(), 1e-4);
  int64_t running = 0;
  for (const auto& [k, b] : G->named_buffers())
    if (k.find("running") != std::string::npos) check_recorded(golden, name + ".G.buffer." + k, b, 1e-5), ++running;
  CHECK(running == 2 * (c.upsamplings()));  // mean and var of every BatchNorm

  models::DCGANDiscriminator D(c);
  nd::testing::fill_closed_form(*D);
  const Tensor logits = D(closed_form_uniform("images", {2, c.nc, s, s}, -1, 1));
  const Tensor loss_d = binary_cross_entropy_with_logits(logits, tensor({1.0, 0.0}, kFloat32));
  loss_d.backward();
  // dcgan64's reference ends in the example's Sigmoid and BCELoss: the same loss and
  // gradients as BCE-with-logits on our logits.
  check_recorded(golden, name + (sigmoid ? ".D.out.prob" : ".D.out.logits"), sigmoid ? logits.sigmoid() : logits, 1e-4);
  check_recorded(golden, name + ".D.out.loss", loss_d, 1e-4);
  for (const auto& [k, p] : D->named_parameters()) check_recorded(golden, name + ".D.grad." + k, p.grad(), 1e-4);
  // Every gradient the reference recorded is one of ours (and the converse above).
  int64_t recorded = 0;
  for (const auto& [k, v] : golden)
    if (k.rfind(name + ".", 0) == 0 && k.find(".grad.") != std::string::npos) ++recorded;
  CHECK(recorded == static_cast<int64_t>(G->named_parameters().size() + D->named_parameters().size()));
}

}  // namespace

TEST_CASE("golden: dcgan64 is examples/dcgan: outputs, BatchNorm statistics, losses and gradients (batch 2)") {
  check_dcgan("dcgan64", /*sigmoid=*/true);
}

TEST_CASE("golden: dcgan32, outputs, BatchNorm statistics, losses and gradients (batch 2)") {
  check_dcgan("dcgan32", /*sigmoid=*/false);
}
