// nn::Module naming: tensors carry their dotted path from the root, also for
// modules added after the tree was built, and under a root prefix ('D.main.0.weight').
#include "harness.h"

using namespace nd;

TEST_CASE("module: tensor names follow the tree, whenever a module is added") {
  auto root = std::make_shared<nn::Module>("Net");
  nn::ModuleList blocks;
  root->register_module("blocks", blocks);
  blocks->push_back(nn::Linear(nn::LinearOptions(2, 3)));  // added after registration
  root->name_tensors("D");
  blocks->push_back(nn::Linear(nn::LinearOptions(3, 1)));  // added after naming
  std::vector<std::string> names;
  for (auto& [key, t] : root->named_parameters()) names.push_back(key + "=" + t.name());
  CHECK(names == std::vector<std::string>{"blocks.0.weight=D.blocks.0.weight", "blocks.0.bias=D.blocks.0.bias",
                                          "blocks.1.weight=D.blocks.1.weight", "blocks.1.bias=D.blocks.1.bias"});
}

TEST_CASE("module: holders of default-constructible layers are built, others start empty") {
  nn::ReLU relu;
  CHECK_FALSE(relu.is_empty());
  nn::Sequential seq;
  CHECK(seq->size() == 0);
  nn::Linear empty;
  CHECK(empty.is_empty());
  CHECK(nd::testing::error_message([&] { empty->forward(ones({1, 2})); }).find("empty module holder") !=
        std::string::npos);
  nn::Linear none(nullptr);
  CHECK(none.is_empty());
}

TEST_CASE("module: a child outliving its parent keeps working") {
  nn::Linear child(nn::LinearOptions(2, 2));
  {
    auto parent = std::make_shared<nn::Module>("Parent");
    parent->register_module("fc", child);
  }
  auto other = std::make_shared<nn::Module>("Other");
  other->register_module("layer", child);
  CHECK(child->weight.name() == "layer.weight");
}
