#pragma once
// nn::Embedding over nd::embedding: a lookup table. state_dict: weight
// [num_embeddings, embedding_dim]. Tests: tests/nn/layers_test.cpp.
#include <optional>

#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  ND_ARG(int64_t, num_embeddings);
  ND_ARG(int64_t, embedding_dim);
  // A row that is zero-initialised and gets no gradient; negative counts from the end.
  ND_ARG(std::optional<int64_t>, padding_idx) = std::nullopt;
};

// Init: weight N(0, 1), the padding_idx row zeroed.
class EmbeddingImpl : public Module {
 public:
  explicit EmbeddingImpl(const EmbeddingOptions& options);
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
      : EmbeddingImpl(EmbeddingOptions(num_embeddings, embedding_dim)) {}
  void reset_parameters();
  // indices int64/int32 of any shape -> indices.sizes() + [embedding_dim].
  Tensor forward(const Tensor& indices) override;

  EmbeddingOptions options;
  Tensor weight;
};
ND_MODULE(Embedding);

}  // namespace nd::nn
