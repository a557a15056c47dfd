// Models against PyTorch: tests/golden/make_models_golden.py built the same tiny DCGAN
// (G and D) and MAE in PyTorch (float64 from float32 weights and inputs), ran one
// training step (forward, backward, Adam / AdamW) and stored weights, inputs, outputs,
// every gradient and the updated weights. Here the same step runs in f32; outputs and
// gradients must match to 1e-4 and updated weights to 1e-5 (relative to each tensor's scale).
#include <memory>

#include "golden_record.h"

using namespace nd;

using nd::testing::check_close_scaled;

namespace {

TensorDict golden(const std::string& file, const std::string& prefix) {
  TensorDict out;
  for (const auto& [k, v] : nd::testing::load_golden(file))
    if (k.rfind(prefix + ".", 0) == 0) out[k.substr(prefix.size() + 1)] = v;
  return out;
}

// Entries "<group>.name" without the group.
TensorDict group(const TensorDict& g, const std::string& name) {
  TensorDict out;
  for (const auto& [k, v] : g)
    if (k.rfind(name + ".", 0) == 0) out[k.substr(name.size() + 1)] = v;
  return out;
}

// Updated parameters to 1e-5 of their scale, plus what the gradient's own tolerance
// (delta = 1e-4 of its scale, as checked above) can move a first Adam step,
// lr * g / (|g| + eps): lr * eps * delta / (|g| - delta)^2 (small gradients magnify their
// rounding through eps). Where |g| <= 2 delta the step may take the sign of rounding
// noise (f32 here, f64 in the reference; e.g. the key part of attention's qkv bias,
// whose exact gradient is 0 because softmax ignores a shift shared by all keys): there
// both steps are only at most lr from the same (decayed) start, |actual - expected| <= 2 lr.
void check_step(const Tensor& actual, const Tensor& expected, const Tensor& grad, double lr, const std::string& what) {
  const auto a = nd::testing::to_vector(actual), e = nd::testing::to_vector(expected);
  const auto g = nd::testing::to_vector(grad);
  double scale = 0, grad_scale = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    scale = std::max(scale, std::abs(e[i]));
    grad_scale = std::max(grad_scale, std::abs(g[i]));
  }
  REQUIRE(a.size() == e.size());
  const double delta = 1e-4 * grad_scale, adam_eps = 1e-8;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tol = 1e-5 * scale + 1e-7 + 1e-5 * std::abs(e[i]);
    const double slack = std::abs(g[i]) <= 2 * delta
                             ? 2 * lr * (1 + 1e-3)
                             : lr * adam_eps * delta / ((std::abs(g[i]) - delta) * (std::abs(g[i]) - delta));
    if (std::abs(a[i] - e[i]) > tol + slack) {
      if (++bad <= 5) MESSAGE(what, ": element ", i, " is ", a[i], ", expected ", e[i], " (gradient ", g[i], ")");
    }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " element(s) out of tolerance");
}

// Loads param.*, runs `run` (returns the loss and named outputs), backward, one step of
// `opt`, then compares outputs, every gradient and the state dict after the step.
template <class Run, class MakeOptimizer>
void run_golden(const std::string& file, const std::string& prefix, nn::Module& module, Run run,
                MakeOptimizer make_optimizer, double lr = 1e-3) {
  CAPTURE(prefix);
  const TensorDict g = golden(file, prefix);
  module.load_state_dict(group(g, "param"));
  const TensorDict inputs = group(g, "input");
  auto [loss, outputs] = run(inputs);
  for (const auto& [k, v] : group(g, "out")) check_close_scaled(outputs.at(k), v, 1e-4, prefix + " output " + k);
  loss.backward();
  const TensorDict grads = group(g, "grad");
  CHECK(grads.size() == module.parameters().size());
  for (const auto& [k, p] : module.named_parameters())
    check_close_scaled(p.grad(), grads.at(k), 1e-4, prefix + " grad " + k);
  make_optimizer(module.parameters())->step();
  const TensorDict after = group(g, "after"), state = module.state_dict();
  CHECK(after.size() == state.size());
  for (const auto& [k, v] : after) {
    if (grads.count(k)) check_step(state.at(k), v, grads.at(k), lr, prefix + " after step " + k);
    else check_close_scaled(state.at(k), v, 1e-5, prefix + " after step " + k);  // buffers
  }
}

auto gan_adam() {
  return [](std::vector<Tensor> params) {
    return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions(1e-3).betas({0.5, 0.999}));
  };
}

}  // namespace

TEST_CASE("golden: DCGAN generator, one Adam step") {
  models::DCGANGenerator G(/*nz=*/8, /*ngf=*/4);
  run_golden("models_dcgan.safetensors", "G", *G, [&](const TensorDict& in) {
    Tensor fake = G(in.at("z"));
    return std::pair<Tensor, TensorDict>{(fake * in.at("grad_out")).sum(), {{"fake", fake}}};
  }, gan_adam());
}

TEST_CASE("golden: DCGAN discriminator, BCE-with-logits, one Adam step") {
  models::DCGANDiscriminator D(/*ndf=*/4);
  run_golden("models_dcgan.safetensors", "D", *D, [&](const TensorDict& in) {
    Tensor logits = D(in.at("x"));
    Tensor loss = binary_cross_entropy_with_logits(logits, in.at("y"));
    return std::pair<Tensor, TensorDict>{loss, {{"logits", logits}, {"loss", loss}}};
  }, gan_adam());
}

TEST_CASE("golden: MAE with fixed masking noise, norm_pix_loss, one AdamW step") {
  models::MAEConfig c;
  c.embed_dim = 16, c.depth = 1, c.num_heads = 2, c.decoder_embed_dim = 8, c.decoder_depth = 1, c.decoder_num_heads = 2;
  models::MAE mae(c);
  run_golden("models_mae.safetensors", "MAE", *mae, [&](const TensorDict& in) {
    models::MAEOutput out = mae(in.at("images"), in.at("noise"));
    return std::pair<Tensor, TensorDict>{out.loss, {{"loss", out.loss}, {"pred", out.pred}, {"mask", out.mask}}};
  }, [](std::vector<Tensor> params) {
    optim::AdamWOptions options(1e-3);
    options.weight_decay(0.05);
    return std::make_unique<optim::AdamW>(std::move(params), options);
  });
}
