#include "engine/nn/embedding.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/embedding.h"

namespace nd::nn {

EmbeddingImpl::EmbeddingImpl(const EmbeddingOptions& options_) : Module("Embedding"), options(options_) {
  const int64_t n = options.num_embeddings();
  ND_CHECK(n > 0, "Embedding: num_embeddings must be positive, got ", n);
  ND_CHECK(options.embedding_dim() > 0, "Embedding: embedding_dim must be positive, got ", options.embedding_dim());
  if (options.padding_idx()) {
    const int64_t p = *options.padding_idx();
    ND_CHECK(p >= -n && p < n, "Embedding: padding_idx must be within num_embeddings (", n, "), got ", p);
    options.padding_idx(p < 0 ? p + n : p);  // stored wrapped, as PyTorch does
  }
  weight = register_parameter("weight", empty({n, options.embedding_dim()}));
  reset_parameters();
}

void EmbeddingImpl::reset_parameters() {
  init::normal_(weight);
  if (options.padding_idx()) {
    NoGradGuard no_grad;
    weight.select(0, *options.padding_idx()).fill_(0);
  }
}

Tensor EmbeddingImpl::forward(const Tensor& indices) {
  return embedding(weight, indices, options.padding_idx().value_or(-1));
}

}  // namespace nd::nn
