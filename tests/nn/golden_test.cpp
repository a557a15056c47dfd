// nn layers against PyTorch: tests/golden/make_nn_golden.py ran each layer in PyTorch
// (float64, from float32 weights and inputs) and wrote weights, input, output and every
// gradient; here the same weights go in through load_state_dict, the same forward and
// backward run in f32, and everything must match to 1e-4 (relative to the tensor's scale).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness.h"

using namespace nd;

namespace {

// Reads tests/golden/nn_<name>.txt: lines "name|d0,d1|v0 v1 ..." ('#' lines are comments).
TensorDict read_golden(const std::string& name) {
  const auto path = std::filesystem::path(NANODDP_SOURCE_DIR) / "tests" / "golden" / ("nn_" + name + ".txt");
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path.string(), " (run tests/golden/make_nn_golden.py)");
  TensorDict out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t a = line.find('|'), b = line.find('|', a + 1);
    REQUIRE(b != std::string::npos);
    Shape shape;
    std::stringstream dims(line.substr(a + 1, b - a - 1));
    for (std::string d; std::getline(dims, d, ',');) shape.push_back(std::stoll(d));
    std::vector<double> values;
    std::stringstream vs(line.substr(b + 1));
    for (std::string v; vs >> v;) values.push_back(std::strtod(v.c_str(), nullptr));  // strtod reads "-inf"
    REQUIRE(static_cast<int64_t>(values.size()) == shape_numel(shape));
    out[line.substr(0, a)] = tensor(values).reshape(shape);
  }
  return out;
}

// Entries "<prefix>name" without the prefix.
TensorDict with_prefix(const TensorDict& golden, const std::string& prefix) {
  TensorDict out;
  for (const auto& [k, v] : golden)
    if (k.rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = v;
  return out;
}

void check_golden(const Tensor& actual, const Tensor& expected, const std::string& what) {
  double scale = 0;
  for (double v : nd::testing::to_vector(expected)) scale = std::max(scale, std::abs(v));
  nd::testing::check_close(actual, expected, 1e-4 * scale + 1e-7, 1e-4, what);
}

// Loads the golden weights, makes the inputs leaves requiring grad, runs `call`,
// backpropagates grad_out and compares the output and every gradient.
template <class Call>
void run_golden(const std::string& name, nn::Module& module, Call call) {
  CAPTURE(name);
  const TensorDict g = read_golden(name);
  module.load_state_dict(with_prefix(g, "param."));
  TensorDict inputs = with_prefix(g, "input.");
  for (auto& [k, v] : inputs)
    if (v.is_floating_point()) v.requires_grad_(true);
  const Tensor out = call(inputs);
  check_golden(out, g.at("out"), name + " output");
  out.backward(g.at("grad_out"));
  for (const auto& [k, p] : module.named_parameters()) check_golden(p.grad(), g.at("grad." + k), name + " grad " + k);
  for (const auto& [k, v] : inputs)
    if (g.count("grad." + k)) check_golden(v.grad(), g.at("grad." + k), name + " grad input " + k);
  const TensorDict state = module.state_dict();
  for (const auto& [k, v] : with_prefix(g, "after.")) check_golden(state.at(k), v, name + " " + k + " after forward");
}

}  // namespace

TEST_CASE("golden: Linear, 3-D input") {
  nn::Linear m(nn::LinearOptions(5, 3));
  run_golden("linear", *m, [&](TensorDict& in) { return m(in.at("x")); });
}

TEST_CASE("golden: Conv2d, stride 2, padding 2, dilation 2, groups 2") {
  nn::Conv2d m(nn::Conv2dOptions(4, 4, 3).stride(2).padding(2).dilation(2).groups(2));
  run_golden("conv2d", *m, [&](TensorDict& in) { return m(in.at("x")); });
}

TEST_CASE("golden: ConvTranspose2d, stride 2, padding 1, output_padding 1, groups 2") {
  nn::ConvTranspose2d m(nn::ConvTranspose2dOptions(4, 4, 3).stride(2).padding(1).output_padding(1).groups(2));
  run_golden("conv_transpose2d", *m, [&](TensorDict& in) { return m(in.at("x")); });
}

TEST_CASE("golden: BatchNorm2d training, running stats and num_batches_tracked") {
  nn::BatchNorm2d m(nn::BatchNormOptions(3).momentum(0.2));
  run_golden("batch_norm2d", *m, [&](TensorDict& in) { return m(in.at("x")); });
}

TEST_CASE("golden: LayerNorm over two trailing dims") {
  nn::LayerNorm m(nn::LayerNormOptions({4, 5}));
  run_golden("layer_norm", *m, [&](TensorDict& in) { return m(in.at("x")); });
}

TEST_CASE("golden: MultiheadAttention, batch_first cross-attention with a bool mask") {
  nn::MultiheadAttention m(nn::MultiheadAttentionOptions(4, 2).batch_first(true));
  run_golden("mha", *m, [&](TensorDict& in) {
    return std::get<0>(m->forward(in.at("q"), in.at("k"), in.at("v"), {.attn_mask = in.at("mask").to(kBool)}));
  });
}

TEST_CASE("golden: MultiheadAttention, causal self-attention, sequence first") {
  nn::MultiheadAttention m(nn::MultiheadAttentionOptions(4, 2));
  run_golden("mha_causal", *m, [&](TensorDict& in) {
    const Tensor& x = in.at("x");
    return std::get<0>(m->forward(x, x, x, {.is_causal = true}));
  });
}

TEST_CASE("golden: MultiheadAttention, bool key_padding_mask merged with a float attn_mask") {
  nn::MultiheadAttention m(nn::MultiheadAttentionOptions(4, 2).batch_first(true));
  run_golden("mha_padding", *m, [&](TensorDict& in) {
    return std::get<0>(m->forward(in.at("q"), in.at("k"), in.at("v"),
                                  {.key_padding_mask = in.at("pad").to(kBool), .attn_mask = in.at("bias").detach()}));
  });
}

namespace {

// need_weights cases: the script's out is the output and the weights, flattened and joined.
Tensor out_and_weights(const std::tuple<Tensor, Tensor>& r) {
  return cat({std::get<0>(r).reshape({-1}), std::get<1>(r).reshape({-1})});
}

}  // namespace

TEST_CASE("golden: MultiheadAttention, need_weights averaged over heads, float key_padding_mask") {
  nn::MultiheadAttention m(nn::MultiheadAttentionOptions(4, 2));
  run_golden("mha_weights", *m, [&](TensorDict& in) {
    const Tensor& kv = in.at("kv");
    return out_and_weights(m->forward(in.at("q"), kv, kv, {.key_padding_mask = in.at("pad").detach(),
                                                            .need_weights = true}));
  });
}

TEST_CASE("golden: MultiheadAttention, per-head weights with a 3-D bool attn_mask") {
  nn::MultiheadAttention m(nn::MultiheadAttentionOptions(6, 3).batch_first(true));
  run_golden("mha_weights_per_head", *m, [&](TensorDict& in) {
    const Tensor& kv = in.at("kv");
    return out_and_weights(m->forward(in.at("x"), kv, kv, {.need_weights = true,
                                                           .attn_mask = in.at("mask").to(kBool),
                                                           .average_attn_weights = false}));
  });
}

TEST_CASE("golden: MultiheadAttention, unbatched causal self-attention with a key_padding_mask and weights") {
  nn::MultiheadAttention m(nn::MultiheadAttentionOptions(4, 2));
  run_golden("mha_causal_padding", *m, [&](TensorDict& in) {
    const Tensor& x = in.at("x");
    return out_and_weights(
        m->forward(x, x, x, {.key_padding_mask = in.at("pad").to(kBool), .need_weights = true, .is_causal = true}));
  });
}

// The call forms a LibTorch port uses, on the same goldens: the positional forward (its
// default need_weights = true) and the holder's call operator with the arguments struct.
TEST_CASE("golden: MultiheadAttention through LibTorch's positional forward and the holder's call operator") {
  nn::MultiheadAttention m(nn::MultiheadAttentionOptions(4, 2));
  run_golden("mha_weights", *m, [&](TensorDict& in) {
    const Tensor& kv = in.at("kv");
    return out_and_weights(m->forward(in.at("q"), kv, kv, in.at("pad").detach()));
  });
  nn::MultiheadAttention per_head(nn::MultiheadAttentionOptions(6, 3).batch_first(true));
  run_golden("mha_weights_per_head", *per_head, [&](TensorDict& in) {
    const Tensor& kv = in.at("kv");
    return out_and_weights(per_head->forward(in.at("x"), kv, kv, Tensor(), true, in.at("mask").to(kBool), false));
  });
  nn::MultiheadAttention padded(nn::MultiheadAttentionOptions(4, 2).batch_first(true));
  run_golden("mha_padding", *padded, [&](TensorDict& in) {
    return std::get<0>(padded(in.at("q"), in.at("k"), in.at("v"),
                              {.key_padding_mask = in.at("pad").to(kBool), .attn_mask = in.at("bias").detach()}));
  });
  nn::MultiheadAttention held(nn::MultiheadAttentionOptions(4, 2));
  run_golden("mha_weights", *held, [&](TensorDict& in) {
    const Tensor& kv = in.at("kv");
    return out_and_weights(held(in.at("q"), kv, kv, in.at("pad").detach()));  // positional through the holder
  });
}

