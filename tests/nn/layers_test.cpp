// nn layers: PyTorch's state_dict names for a nested tree, tensor names, init
// distributions (PyTorch's bounds, checked statistically), train/eval behaviour,
// forward values against the functional ops, strict loading, and option errors.
#include <cmath>
#include <set>

#include "harness.h"

using namespace nd;
using nd::testing::check_close;
using nd::testing::error_message;
using nd::testing::to_vector;

namespace {

// A discriminator-like tree; PyTorch's state_dict for the same tree (printed by
// torch 2.x) is `expected` below.
struct TreeImpl : nn::Module {
  TreeImpl() : nn::Module("Tree") {
    main = register_module("main", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 8, 4).stride(2).padding(1)),
                                                  nn::BatchNorm2d(8),
                                                  nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                                                  nn::Conv2d(nn::Conv2dOptions(8, 1, 3).bias(false)), nn::Flatten()));
    attn = register_module("attn", nn::MultiheadAttention(nn::MultiheadAttentionOptions(8, 2).batch_first(true)));
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({8})));
    emb = register_module("emb", nn::Embedding(nn::EmbeddingOptions(10, 8).padding_idx(0)));
    blocks = register_module("blocks", nn::ModuleList(nn::Linear(8, 8), nn::Dropout(0.1),
                                                      nn::Linear(nn::LinearOptions(8, 4).bias(false))));
  }
  nn::Sequential main{nullptr};
  nn::MultiheadAttention attn{nullptr};
  nn::LayerNorm norm{nullptr};
  nn::Embedding emb{nullptr};
  nn::ModuleList blocks{nullptr};
};
ND_MODULE(Tree);

const std::vector<std::pair<std::string, Shape>> kTorchStateDict = {
    {"main.0.weight", {8, 1, 4, 4}}, {"main.0.bias", {8}}, {"main.1.weight", {8}}, {"main.1.bias", {8}},
    {"main.1.running_mean", {8}}, {"main.1.running_var", {8}}, {"main.1.num_batches_tracked", {}},
    {"main.3.weight", {1, 8, 3, 3}}, {"attn.in_proj_weight", {24, 8}}, {"attn.in_proj_bias", {24}},
    {"attn.out_proj.weight", {8, 8}}, {"attn.out_proj.bias", {8}}, {"norm.weight", {8}}, {"norm.bias", {8}},
    {"emb.weight", {10, 8}}, {"blocks.0.weight", {8, 8}}, {"blocks.0.bias", {8}}, {"blocks.2.weight", {4, 8}}};

struct Stats {
  double mean = 0, var = 0, max_abs = 0;
};
Stats stats(const Tensor& t) {
  const auto v = to_vector(t);
  Stats s;
  for (double x : v) s.mean += x, s.max_abs = std::max(s.max_abs, std::abs(x));
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.var += (x - s.mean) * (x - s.mean);
  s.var /= static_cast<double>(v.size());
  return s;
}

// U(-bound, bound): mean 0, variance bound^2 / 3, samples reaching close to the bound
// and never past it. Tolerances are ~10 standard errors for the sizes used here.
void check_uniform(const Tensor& t, double bound, const std::string& what) {
  CAPTURE(what);
  const Stats s = stats(t);
  CHECK(s.max_abs <= bound * (1 + 1e-6));
  CHECK(s.max_abs >= bound * 0.98);
  CHECK(std::abs(s.mean) <= 0.05 * bound);
  CHECK(s.var == doctest::Approx(bound * bound / 3).epsilon(0.06));
}

}  // namespace

TEST_CASE("state_dict: a nested tree has PyTorch's keys, shapes and parameter order") {
  Tree tree;
  const TensorDict sd = tree->state_dict();
  std::set<std::string> ours, torch_keys;
  for (const auto& [k, v] : sd) ours.insert(k);
  for (const auto& [k, shape] : kTorchStateDict) {
    torch_keys.insert(k);
    REQUIRE_MESSAGE(sd.count(k), "missing ", k);
    CHECK_MESSAGE(sd.at(k).sizes() == shape, k, " has shape ", shape_str(sd.at(k).sizes()));
  }
  CHECK(ours == torch_keys);
  CHECK(sd.at("main.1.num_batches_tracked").dtype() == kInt64);
  // named_parameters in registration order, as PyTorch's (buffers left out).
  std::vector<std::string> expected_params;
  for (const auto& [k, shape] : kTorchStateDict)
    if (k.find("running_") == std::string::npos && k.find("num_batches") == std::string::npos)
      expected_params.push_back(k);
  std::vector<std::string> params;
  for (const auto& [k, p] : tree->named_parameters()) {
    params.push_back(k);
    CHECK_MESSAGE(p.name() == k, "tensor name ", p.name(), " for ", k);
    CHECK(p.requires_grad());
  }
  CHECK(params == expected_params);
  CHECK(sd.at("main.1.running_mean").name() == "main.1.running_mean");
  CHECK(!sd.at("main.1.running_mean").requires_grad());
}

TEST_CASE("containers: Sequential and ModuleList") {
  nn::Sequential seq;
  seq->push_back(nn::Linear(3, 4));
  seq->push_back(std::make_shared<nn::ReLUImpl>());
  seq->push_back(nn::Linear(4, 2));
  CHECK(seq->size() == 3);
  std::vector<std::string> names;
  for (const auto& [name, child] : seq->named_children()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"0", "1", "2"});
  CHECK(seq[1]->type_name() == "ReLU");
  auto first = seq->ptr<nn::LinearImpl>(0);
  auto last = seq->ptr<nn::LinearImpl>(2);
  CHECK(error_message([&] { seq->ptr<nn::LinearImpl>(1); }).find("module 1 is a ReLU") != std::string::npos);
  CHECK(error_message([&] { (void)seq[3]; }).find("index 3 is out of range") != std::string::npos);

  const Tensor x = randn({5, 3});
  const Tensor manual = nn::functional::linear(relu(nn::functional::linear(x, first->weight, first->bias)),
                                               last->weight, last->bias);
  check_close(seq->forward(x), manual, 1e-6, 1e-6, "Sequential chains its children");
  check_close(nn::Sequential()(x), x, 0, 0, "an empty Sequential is the identity");

  nn::ModuleList list(nn::Linear(2, 2), nn::Tanh());
  list->push_back(nn::GELU());
  CHECK(list->size() == 3);
  int count = 0;
  for (const auto& m : *list) count += m != nullptr;
  CHECK(count == 3);
  CHECK(list->state_dict().count("0.weight") == 1);
  CHECK(error_message([&] { list->forward(x); }).find("ModuleList has no single-tensor forward") !=
        std::string::npos);
  CHECK(error_message([&] { seq->push_back(nn::Linear(nullptr)); }).find("empty module") != std::string::npos);
}

// Sequential runs BatchNorm2d and the ReLU / LeakyReLU after it as one op (its node names
// both), with the values, running statistics and gradients of the modules one by one; a
// LeakyReLU with a negative slope, a subclass with its own forward, or a BatchNorm2d
// followed by anything else, runs alone.
TEST_CASE("containers: Sequential runs BatchNorm2d + ReLU / LeakyReLU as one op, the same bits") {
  struct TwiceReLU : nn::ReLUImpl {
    Tensor forward(const Tensor& input) override { return nn::ReLUImpl::forward(input) * 2.0; }
  };
  const auto leaky = [](double slope) { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(slope)); };
  struct Case {
    nn::Sequential seq;
    const char* node;
  };
  std::vector<Case> cases;
  cases.push_back({nn::Sequential(nn::BatchNorm2d(3), nn::ReLU()), "NativeBatchNormReluBackward"});
  cases.push_back({nn::Sequential(nn::BatchNorm2d(3), leaky(0.2)), "NativeBatchNormLeakyReluBackward"});
  cases.push_back({nn::Sequential(nn::BatchNorm2d(3), leaky(-0.2)), "LeakyReluBackward"});
  cases.push_back({nn::Sequential(nn::BatchNorm2d(3), nn::Tanh()), "TanhBackward"});
  cases.push_back({nn::Sequential(nn::BatchNorm2d(3), std::make_shared<TwiceReLU>()), "MulBackward"});
  for (Case& c : cases) {
    CAPTURE(c.node);
    for (const bool training : {true, false}) {
      CAPTURE(training);
      auto bn = c.seq->ptr<nn::BatchNorm2dImpl>(0);
      {
        NoGradGuard no_grad;
        nn::init::normal_(bn->weight, 1.0, 0.5);
        nn::init::normal_(bn->bias, 0.0, 0.5);
        nn::init::normal_(bn->running_mean, 0.0, 0.5);
      }
      const Tensor rm0 = bn->running_mean.clone(), rv0 = bn->running_var.clone();
      const Tensor x = randn({4, 3, 5, 5}), dy = randn({4, 3, 5, 5});
      auto run = [&](bool whole) {
        c.seq->train(training);
        {
          NoGradGuard no_grad;
          bn->running_mean.copy_(rm0);
          bn->running_var.copy_(rv0);
        }
        c.seq->zero_grad();
        const Tensor xg = x.clone().requires_grad_();
        const Tensor y = whole ? c.seq->forward(xg) : c.seq[1]->forward(c.seq[0]->forward(xg));
        if (whole) CHECK(y.grad_fn()->name() == c.node);
        (y * dy).sum().backward();
        return std::vector<Tensor>{y.detach(), bn->running_mean.clone(), bn->running_var.clone(), xg.grad(),
                                   bn->weight.grad(), bn->bias.grad()};
      };
      const std::vector<Tensor> whole = run(true), one_by_one = run(false);
      const char* names[] = {"y", "running_mean", "running_var", "x.grad", "weight.grad", "bias.grad"};
      for (size_t i = 0; i < whole.size(); ++i) {
        CAPTURE(names[i]);
        CHECK(nd::testing::bitwise_equal(whole[i], one_by_one[i]));
      }
    }
  }
}

TEST_CASE("init: PyTorch's distributions and bounds") {
  manual_seed(7);
  SUBCASE("Linear: kaiming_uniform_(a=sqrt(5)) weight, U(+-1/sqrt(in)) bias") {
    nn::Linear m(nn::LinearOptions(400, 300));
    check_uniform(m->weight, 1 / std::sqrt(400.0), "Linear.weight");
    nn::Linear wide(nn::LinearOptions(100, 4000));
    check_uniform(wide->bias, 1 / std::sqrt(100.0), "Linear.bias");
  }
  SUBCASE("Conv2d: fan_in = in/groups * kH * kW") {
    nn::Conv2d m(nn::Conv2dOptions(64, 512, {4, 2}).groups(4));
    check_uniform(m->weight, 1 / std::sqrt(16.0 * 8), "Conv2d.weight");
    nn::Conv2d wide(nn::Conv2dOptions(8, 4096, 1));
    check_uniform(wide->bias, 1 / std::sqrt(8.0), "Conv2d.bias");
  }
  SUBCASE("ConvTranspose2d: fan_in from weight [in, out/groups, kH, kW], as PyTorch") {
    nn::ConvTranspose2d m(nn::ConvTranspose2dOptions(512, 64, 4).groups(2));
    CHECK(m->weight.sizes() == Shape{512, 32, 4, 4});
    check_uniform(m->weight, 1 / std::sqrt(32.0 * 16), "ConvTranspose2d.weight");
    nn::ConvTranspose2d wide(nn::ConvTranspose2dOptions(8, 3000, 2));
    check_uniform(wide->bias, 1 / std::sqrt(3000.0 * 4), "ConvTranspose2d.bias");
  }
  SUBCASE("MultiheadAttention: xavier in_proj, zero biases, Linear out_proj") {
    nn::MultiheadAttention m(nn::MultiheadAttentionOptions(128, 8));
    check_uniform(m->in_proj_weight, std::sqrt(6.0 / (128 + 384)), "in_proj_weight");
    check_uniform(m->out_proj->weight, 1 / std::sqrt(128.0), "out_proj.weight");
    CHECK(stats(m->in_proj_bias).max_abs == 0);
    CHECK(stats(m->out_proj->bias).max_abs == 0);
  }
  SUBCASE("Embedding: N(0, 1) with the padding row zeroed; norms: ones and zeros") {
    nn::Embedding e(nn::EmbeddingOptions(1000, 64).padding_idx(-1));
    CHECK(*e->options.padding_idx() == 999);
    const Stats s = stats(e->weight.narrow(0, 0, 999));
    CHECK(std::abs(s.mean) < 0.02);
    CHECK(s.var == doctest::Approx(1).epsilon(0.03));
    CHECK(stats(e->weight.select(0, 999)).max_abs == 0);
    nn::BatchNorm2d bn(4);
    check_close(bn->weight, {1, 1, 1, 1}, 0, 0, "bn.weight");
    check_close(bn->bias, {0, 0, 0, 0}, 0, 0, "bn.bias");
    check_close(bn->running_var, {1, 1, 1, 1}, 0, 0, "bn.running_var");
    nn::LayerNorm ln(nn::LayerNormOptions({2, 3}));
    check_close(ln->weight.flatten(), {1, 1, 1, 1, 1, 1}, 0, 0, "ln.weight");
  }
  SUBCASE("init functions: gains, fan modes, normal variants, errors") {
    CHECK(nn::init::calculate_gain(nn::init::Nonlinearity::kLeakyReLU, std::sqrt(5.0)) ==
          doctest::Approx(std::sqrt(1.0 / 3)));
    CHECK(nn::init::calculate_gain(nn::init::Nonlinearity::kTanh) == doctest::Approx(5.0 / 3));
    const Tensor w = empty({200, 50, 3, 3});
    CHECK(nn::init::calculate_fan_in_and_fan_out(w) == std::pair<int64_t, int64_t>{450, 1800});
    nn::init::kaiming_uniform_(w, 0, nn::init::FanMode::kFanOut, nn::init::Nonlinearity::kReLU);
    check_uniform(w, std::sqrt(2.0) * std::sqrt(3.0 / 1800), "kaiming_uniform_ fan_out relu");
    const int64_t v0 = w._version();
    nn::init::kaiming_normal_(w, 0, nn::init::FanMode::kFanIn, nn::init::Nonlinearity::kReLU);
    CHECK(w._version() == v0 + 1);
    CHECK(stats(w).var == doctest::Approx(2.0 / 450).epsilon(0.03));
    nn::init::xavier_normal_(w, 2.0);
    CHECK(stats(w).var == doctest::Approx(4.0 * 2 / (450 + 1800)).epsilon(0.03));
    const Tensor u = empty({100000});
    nn::init::uniform_(u, 2, 5);
    const Stats su = stats(u);
    CHECK(su.mean == doctest::Approx(3.5).epsilon(0.01));
    nn::init::normal_(u, -1, 3);
    CHECK(stats(u).mean == doctest::Approx(-1).epsilon(0.05));
    CHECK(stats(u).var == doctest::Approx(9).epsilon(0.03));
    // Parameters are filled under no-grad: no history, still leaves.
    nn::Linear m(2, 2);
    nn::init::normal_(m->weight);
    CHECK(m->weight.is_leaf());
    CHECK(error_message([] { nn::init::xavier_uniform_(empty({5})); }).find("fewer than 2 dimensions") !=
          std::string::npos);
  }
}

TEST_CASE("forward: layers equal their functional ops") {
  manual_seed(3);
  const Tensor img = randn({2, 4, 6, 6});
  nn::Conv2d conv(nn::Conv2dOptions(4, 6, {3, 2}).stride({2, 1}).padding(1).dilation({1, 2}).groups(2));
  check_close(conv(img), conv2d(img, conv->weight, conv->bias, {2, 1}, {1}, {1, 2}, 2), 0, 0, "Conv2d");
  nn::ConvTranspose2d convt(nn::ConvTranspose2dOptions(4, 2, 4).stride(2).padding(1).bias(false));
  CHECK(!convt->bias.defined());
  const Tensor up = convt(img);
  CHECK(up.sizes() == Shape{2, 2, 12, 12});
  check_close(up, conv_transpose2d(img, convt->weight, {}, {2}, {1}), 0, 0, "ConvTranspose2d");

  const Tensor x = randn({3, 5, 8});
  nn::Linear lin(8, 2);
  check_close(lin(x), x.matmul(lin->weight.t()) + lin->bias, 1e-6, 1e-6, "Linear on [3, 5, 8]");
  nn::LayerNorm ln(nn::LayerNormOptions({8}).eps(1e-3).elementwise_affine(false));
  CHECK(ln->parameters().empty());
  check_close(ln(x), layer_norm(x, {8}, {}, {}, 1e-3), 0, 0, "LayerNorm");

  check_close(nn::ReLU()(x), relu(x), 0, 0, "ReLU");
  check_close(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2))(x), leaky_relu(x, 0.2), 0, 0, "LeakyReLU");
  check_close(nn::Tanh()(x), tanh(x), 0, 0, "Tanh");
  check_close(nn::Sigmoid()(x), sigmoid(x), 0, 0, "Sigmoid");
  check_close(nn::GELU(nn::GELUOptions().approximate("tanh"))(x), gelu(x, "tanh"), 0, 0, "GELU tanh");
  CHECK(nn::Flatten()(img).sizes() == Shape{2, 144});
  CHECK(nn::Flatten(nn::FlattenOptions().start_dim(0).end_dim(1))(img).sizes() == Shape{8, 6, 6});

  nn::Embedding emb(nn::EmbeddingOptions(7, 3).padding_idx(2));
  const Tensor idx = tensor({1, 2, 6, 2}, kInt64).reshape({2, 2});
  check_close(emb(idx), embedding(emb->weight, idx, 2), 0, 0, "Embedding");
  emb(idx).sum().backward();
  check_close(emb->weight.grad().select(0, 2), {0, 0, 0}, 0, 0, "no gradient into the padding row");

  // Losses.
  const Tensor logits = randn({4, 5}), labels = tensor({0, 4, -100, 2}, kInt64);
  const Tensor w = tensor({1, 2, 1, 0.5, 1});
  nn::CrossEntropyLoss ce(nn::CrossEntropyLossOptions().weight(w).label_smoothing(0.1).reduction(Reduction::Sum));
  CHECK(ce->state_dict().count("weight") == 1);
  CHECK(nn::CrossEntropyLoss()->state_dict().empty());
  check_close(ce(logits, labels), cross_entropy(logits, labels, w, Reduction::Sum, -100, 0.1), 0, 0,
              "CrossEntropyLoss");
  nn::CrossEntropyLoss ce_ignore(nn::CrossEntropyLossOptions().ignore_index(0));
  const Tensor labels2 = tensor({0, 4, 0, 2}, kInt64);
  check_close(ce_ignore(logits, labels2), cross_entropy(logits, labels2, {}, Reduction::Mean, 0), 0, 0,
              "CrossEntropyLoss ignore_index");
  const Tensor target = rand({4, 5});
  check_close(nn::MSELoss()(logits, target), mse_loss(logits, target), 0, 0, "MSELoss");
  check_close(nn::MSELoss(Reduction::None)(logits, target), mse_loss(logits, target, Reduction::None), 0, 0,
              "MSELoss none");
  const Tensor pw = tensor({1, 2, 3, 4, 5});
  nn::BCEWithLogitsLoss bce(nn::BCEWithLogitsLossOptions().pos_weight(pw));
  CHECK(bce->state_dict().count("pos_weight") == 1);
  check_close(bce(logits, target), binary_cross_entropy_with_logits(logits, target, {}, pw), 0, 0,
              "BCEWithLogitsLoss");
}

TEST_CASE("MultiheadAttention: masks, layouts and self-attention") {
  manual_seed(11);
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(8, 2).batch_first(true));
  // The attention output (forward returns it with the weights, undefined here).
  auto attend = [](nn::MultiheadAttention& m, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& attn_mask = {}) {
    auto [out, weights] = m->forward(q, k, v, {.attn_mask = attn_mask});
    CHECK(!weights.defined());
    return out;
  };
  const Tensor q = randn({2, 3, 8}), kv = randn({2, 4, 8});
  // PyTorch's bool mask blocks where true; the same as -inf added to the scores.
  const Tensor blocked = tensor({0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0}).reshape({3, 4});
  const Tensor additive = blocked * -1e30;
  check_close(attend(mha, q, kv, kv, blocked.to(kBool)), attend(mha, q, kv, kv, additive), 1e-6, 1e-5,
              "bool mask == float mask");
  // A per-(batch, head) mask [B * H, L, S] equal for all heads gives the same.
  check_close(attend(mha, q, kv, kv, additive.unsqueeze(0).expand({4, 3, 4}).contiguous()),
              attend(mha, q, kv, kv, additive), 1e-6, 1e-5, "3-D mask");
  // Unbatched input and self-attention through the single-tensor forward.
  check_close(attend(mha, q.select(0, 1), kv.select(0, 1), kv.select(0, 1)), attend(mha, q, kv, kv).select(0, 1),
              1e-6, 1e-5, "unbatched [L, E]");
  check_close(mha->forward(q), attend(mha, q, q, q), 0, 0, "forward(x) is self-attention");
  // Self-attention (one tensor as query, key and value) projects with all of in_proj at
  // once; the same values as three separate tensors, which take the q, k, v row blocks,
  // forward and backward (input and parameter gradients).
  {
    const Tensor x1 = q.clone().requires_grad_(), x2 = q.clone().requires_grad_();
    const Tensor w = randn({2, 3, 8});
    mha->zero_grad();
    (attend(mha, x1, x1, x1) * w).sum().backward();
    const Tensor packed_w = mha->in_proj_weight.grad().clone(), packed_b = mha->in_proj_bias.grad().clone();
    mha->zero_grad();
    (attend(mha, x2, x2 * 1.0, x2 * 1.0) * w).sum().backward();
    check_close(x1.grad(), x2.grad(), 1e-6, 1e-5, "self-attention: d/dx");
    check_close(packed_w, mha->in_proj_weight.grad(), 1e-6, 1e-5, "self-attention: d/d in_proj_weight");
    check_close(packed_b, mha->in_proj_bias.grad(), 1e-6, 1e-5, "self-attention: d/d in_proj_bias");
    CHECK(packed_w.is_contiguous());
  }
  // batch_first = false: the same module on [L, B, E].
  nn::MultiheadAttention seq_first(nn::MultiheadAttentionOptions(8, 2));
  seq_first->load_state_dict(mha->state_dict());
  check_close(attend(seq_first, q.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1)).transpose(0, 1),
              attend(mha, q, kv, kv), 1e-6, 1e-5, "sequence-first layout");
  nn::MultiheadAttention nobias(nn::MultiheadAttentionOptions(8, 2).bias(false));
  CHECK(nobias->state_dict().size() == 2);
  CHECK(error_message([&] { mha->forward(q, kv, kv, {.key_padding_mask = ones({2, 3})}); })
            .find("expected key_padding_mask [2, 4] ([batch, keys]), got [cpu f32 [2, 3]]") != std::string::npos);
  CHECK(error_message([&] { mha->forward(q, kv, kv, {.attn_mask = ones({3, 5})}); })
            .find("expected attn_mask [L, S] = [3, 4] or [B * num_heads, L, S] = [4, 3, 4]") != std::string::npos);
  CHECK(error_message([&] { attend(mha, q, randn({2, 4, 6}), kv); }).find("must end in embed_dim=8") !=
        std::string::npos);
}

TEST_CASE("MultiheadAttention: dropout on the weights, the same on the fused and the need_weights path") {
  manual_seed(5);
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(8, 2).dropout(0.4).batch_first(true));
  const Tensor q = randn({2, 3, 8}), kv = randn({2, 6, 8}), w = randn({2, 3, 8});
  const Tensor pad = tensor({0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0}).reshape({2, 6}).to(kBool);
  // Training: both paths draw the weights' mask from the generator in the same order
  // (kernels/common/dropout_mask.h), so equal seeds give equal outputs and gradients.
  auto run = [&](bool need_weights) {
    manual_seed(77);
    mha->zero_grad();
    auto [out, weights] = mha->forward(q, kv, kv, {.key_padding_mask = pad, .need_weights = need_weights});
    (out * w).sum().backward();
    return std::pair{out, mha->in_proj_weight.grad().clone()};
  };
  const auto [fused, fused_grad] = run(false);
  const auto [explicit_out, explicit_grad] = run(true);
  check_close(fused, explicit_out, 1e-6, 1e-5, "dropout: fused == need_weights output");
  check_close(fused_grad, explicit_grad, 1e-6, 1e-5, "dropout: fused == need_weights in_proj_weight grad");
  // The weights returned are the dropped ones: each 0 or the undropped weight / (1 - p).
  nn::MultiheadAttention plain(nn::MultiheadAttentionOptions(8, 2).batch_first(true));
  plain->load_state_dict(mha->state_dict());
  manual_seed(77);
  const auto dropped = nd::testing::to_vector(std::get<1>(
      mha->forward(q, kv, kv, {.key_padding_mask = pad, .need_weights = true, .average_attn_weights = false})));
  const auto undropped = nd::testing::to_vector(std::get<1>(
      plain->forward(q, kv, kv, {.key_padding_mask = pad, .need_weights = true, .average_attn_weights = false})));
  REQUIRE(dropped.size() == 2 * 2 * 3 * 6);
  int zeros_where_positive = 0;
  for (size_t i = 0; i < dropped.size(); ++i) {
    if (dropped[i] == 0.0) zeros_where_positive += undropped[i] > 0.0;
    else CHECK(dropped[i] == doctest::Approx(undropped[i] / 0.6).epsilon(1e-5));
  }
  CHECK(zeros_where_positive > 0);
  // Eval: no dropout; the output equals a dropout-free module's.
  mha->eval();
  check_close(std::get<0>(mha->forward(q, kv, kv, {.key_padding_mask = pad})),
              std::get<0>(plain->forward(q, kv, kv, {.key_padding_mask = pad})), 0, 0, "eval: no dropout");
  CHECK(nd::testing::to_vector(fused) != nd::testing::to_vector(std::get<0>(plain->forward(q, kv, kv,
                                                                                          {.key_padding_mask = pad}))));
}

TEST_CASE("train/eval: BatchNorm2d running stats and Dropout") {
  manual_seed(5);
  nn::BatchNorm2d bn(nn::BatchNormOptions(3).momentum(0.5));
  const Tensor x = randn({4, 3, 2, 2}) * 3 + 1;
  const int64_t v_mean = bn->running_mean._version(), v_count = bn->num_batches_tracked._version();
  const Tensor y = bn(x);
  // Training normalises with batch stats and moves the running stats halfway.
  const Tensor batch_mean = x.mean({0, 2, 3}), batch_var = x.var({0, 2, 3}, 1);
  check_close(y, batch_norm(x, {}, {}, bn->weight, bn->bias, true), 1e-6, 1e-5, "training output");
  check_close(bn->running_mean, batch_mean * 0.5, 1e-6, 1e-5, "running_mean");
  check_close(bn->running_var, batch_var * 0.5 + 0.5, 1e-6, 1e-5, "running_var");
  CHECK(bn->num_batches_tracked.item<int64_t>() == 1);
  CHECK(bn->running_mean._version() == v_mean + 1);
  CHECK(bn->num_batches_tracked._version() > v_count);

  bn->eval();
  CHECK(!bn->is_training());
  const Tensor mean_before = bn->running_mean.clone();
  const Tensor ye = bn(x);
  check_close(bn->running_mean, mean_before, 0, 0, "eval leaves running stats alone");
  CHECK(bn->num_batches_tracked.item<int64_t>() == 1);
  check_close(ye, batch_norm(x, bn->running_mean, bn->running_var, bn->weight, bn->bias, false), 1e-6, 1e-5,
              "eval uses running stats");

  // momentum = nullopt: cumulative average of the batch statistics.
  nn::BatchNorm2d cumulative(nn::BatchNormOptions(3).momentum(std::nullopt));
  const Tensor x2 = randn({4, 3, 2, 2});
  cumulative(x);
  cumulative(x2);
  check_close(cumulative->running_mean, (batch_mean + x2.mean({0, 2, 3})) * 0.5, 1e-6, 1e-5, "cumulative mean");

  // No running stats: batch statistics in training and eval, no buffers.
  nn::BatchNorm2d stateless(nn::BatchNormOptions(3).track_running_stats(false).affine(false));
  CHECK(stateless->state_dict().empty());
  stateless->eval();
  check_close(stateless(x), batch_norm(x, {}, {}, {}, {}, true), 1e-6, 1e-5, "eval without running stats");

  nn::Dropout drop(nn::DropoutOptions(0.25));
  const Tensor ones_in = ones({100000});
  const auto kept = to_vector(drop(ones_in));
  double zeros_seen = 0, survivors_scaled = 0;
  for (double v : kept) {
    zeros_seen += v == 0;
    survivors_scaled += std::abs(v - 1 / 0.75) < 1e-6;
  }
  CHECK(zeros_seen + survivors_scaled == 100000);  // survivors are scaled by 1 / (1 - p)
  CHECK(zeros_seen / 100000 == doctest::Approx(0.25).epsilon(0.04));
  drop->eval();
  CHECK(drop(ones_in).impl_ptr() == ones_in.impl_ptr());
  nn::Sequential net(nn::Linear(2, 2), nn::Dropout());
  net->eval();
  CHECK(!net[1]->is_training());
}

TEST_CASE("load_state_dict: strict errors list every key, a 'module.' prefix is stripped") {
  Tree a, b;
  TensorDict sd;
  for (const auto& [k, v] : a->state_dict()) sd["module." + k] = v;
  b->load_state_dict(sd);
  check_close(b->main[0]->state_dict().at("weight"), a->main[0]->state_dict().at("weight"), 0, 0, "loaded weight");

  TensorDict bad = a->state_dict();
  bad.erase("norm.bias");
  bad.erase("main.1.running_var");
  bad["extra.weight"] = zeros({2});
  bad["emb.weight"] = zeros({11, 8});
  const std::string msg = error_message([&] { b->load_state_dict(bad); });
  for (const char* part : {"Missing key(s)", "\"norm.bias\"", "\"main.1.running_var\"", "Unexpected key(s)",
                           "\"extra.weight\"", "Size mismatch", "emb.weight: checkpoint [11, 8] vs module [10, 8]"})
    CHECK_MESSAGE(msg.find(part) != std::string::npos, part, " not in: ", msg);
  const nn::LoadStateDictResult r = b->load_state_dict(bad, /*strict=*/false);
  CHECK(r.missing_keys.size() == 2);
  CHECK(r.unexpected_keys == std::vector<std::string>{"extra.weight"});
  CHECK(r.mismatched_keys.size() == 1);
}

TEST_CASE("options: bad values give errors naming the layer and the option") {
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[] { nn::Linear(-1, 3); }, "Linear: in_features must be non-negative, got -1"},
      {[] { nn::Conv2d(nn::Conv2dOptions(3, 8, 3).groups(2)); }, "Conv2d: in_channels must be divisible by groups"},
      {[] { nn::Conv2d(nn::Conv2dOptions(4, 8, 0)); }, "Conv2d: kernel_size must be positive"},
      {[] { nn::Conv2d(nn::Conv2dOptions(4, 8, 3).stride({1, 0})); }, "Conv2d: stride must be positive, got [1, 0]"},
      {[] { nn::Conv2d(nn::Conv2dOptions(4, 8, 3).padding(-1)); }, "Conv2d: padding must be non-negative"},
      {[] { nn::Conv2d(nn::Conv2dOptions(4, 8, {3, 3, 3})); }, "expected 1 or 2 values"},
      {[] { nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 6, 3).groups(4)); },
       "ConvTranspose2d: out_channels must be divisible by groups"},
      {[] { nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 4, 3).stride(2).output_padding(2)); },
       "ConvTranspose2d: output_padding must be non-negative and smaller than stride or dilation"},
      {[] { nn::BatchNorm2d(0); }, "BatchNorm2d: num_features must be positive, got 0"},
      {[] { nn::BatchNorm2d(nn::BatchNormOptions(3).momentum(1.5)); }, "BatchNorm2d: momentum must be in [0, 1]"},
      {[] { nn::LayerNorm(nn::LayerNormOptions({4, -2})); }, "LayerNorm: normalized_shape must be positive"},
      {[] { nn::MultiheadAttention(10, 3); },
       "MultiheadAttention: embed_dim must be divisible by num_heads, got embed_dim=10, num_heads=3"},
      {[] { nn::MultiheadAttention(nn::MultiheadAttentionOptions(8, 2).dropout(1.5)); },
       "MultiheadAttention: dropout must be between 0 and 1, got 1.5"},
      {[] { nn::Dropout(1.5); }, "Dropout: p must be in [0, 1], got 1.5"},
      {[] { nn::Embedding(nn::EmbeddingOptions(5, 3).padding_idx(5)); },
       "Embedding: padding_idx must be within num_embeddings (5), got 5"},
      {[] { nn::GELU(nn::GELUOptions().approximate("fast")); }, "GELU: approximate must be \"none\" or \"tanh\""},
      {[] { nn::CrossEntropyLoss(nn::CrossEntropyLossOptions().label_smoothing(-0.1)); },
       "CrossEntropyLoss: label_smoothing must be in [0, 1]"},
      {[] { nn::BatchNorm2d(3)(randn({2, 3, 4})); }, "BatchNorm2d: expected 4D input [N, C, H, W]"},
      {[] { nn::BatchNorm2d(3)(randn({2, 4, 1, 1})); }, "BatchNorm2d: expected 3 channels (num_features)"},
      {[] { nn::Linear(4, 2)(randn({3, 5})); }, "linear: input [cpu f32 [3, 5]] does not end in in_features=4"},
      {[] { nn::Linear l; l->forward(randn({1})); }, "use of an empty module holder"},
  };
  for (const auto& [fn, expected] : cases) {
    const std::string msg = error_message(fn);
    CHECK_MESSAGE(msg.find(expected) != std::string::npos, "expected '", expected, "' in: ", msg);
  }
}

TEST_CASE("layers in f64: Module::to(kFloat64) and finite-difference gradients through a small net") {
  manual_seed(13);
  nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(2, 4, 3).padding(1)), nn::BatchNorm2d(4), nn::GELU(),
                     nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 2, 2).stride(2)), nn::Flatten(),
                     nn::Linear(32, 8));
  net->to(kFloat64);
  for (const Tensor& p : net->parameters()) CHECK(p.dtype() == kFloat64);
  CHECK(net->state_dict().at("1.num_batches_tracked").dtype() == kInt64);  // integer buffers keep their dtype
  nd::testing::gradcheck("Conv2d-BatchNorm2d-GELU-ConvTranspose2d-Flatten-Linear",
                         [&](const std::vector<Tensor>& x) { return net->forward(x[0]); },
                         {nd::testing::random_input({2, 2, 2, 2}, 1).requires_grad_(true)});

  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(4, 2).batch_first(true));
  nn::LayerNorm ln(nn::LayerNormOptions({4}));
  mha->to(kFloat64);
  ln->to(kFloat64);
  nd::testing::gradcheck("LayerNorm-MultiheadAttention",
                         [&](const std::vector<Tensor>& x) { return std::get<0>(mha->forward(ln(x[0]), x[1], x[1])); },
                         {nd::testing::random_input({2, 3, 4}, 2).requires_grad_(true),
                          nd::testing::random_input({2, 5, 4}, 3).requires_grad_(true)});
  // The need_weights path, through the output and the per-head weights, with padding.
  const Tensor pad = tensor({0, 0, 1, 0, 0, 0, 0, 0, 0, 1}).reshape({2, 5}).to(kBool);
  nd::testing::gradcheck(
      "MultiheadAttention need_weights",
      [&](const std::vector<Tensor>& x) {
        auto [out, weights] = mha->forward(x[0], x[1], x[1], {.key_padding_mask = pad, .need_weights = true,
                                                              .average_attn_weights = false});
        return cat({out.reshape({-1}), weights.reshape({-1})});
      },
      {nd::testing::random_input({2, 3, 4}, 4).requires_grad_(true),
       nd::testing::random_input({2, 5, 4}, 5).requires_grad_(true)});
}
