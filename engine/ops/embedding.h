#pragma once
// embedding (LibTorch: torch::embedding(weight, indices, padding_idx)): gathers rows of
// the weight table. Backward node: EmbeddingBackward (dense scatter-add into weight).
#include "engine/tensor.h"

namespace nd {

// out[..., :] = weight[indices[...], :], shape indices.sizes() + [embedding_dim].
// padding_idx (as in LibTorch's torch::embedding, -1 = none; Python's negative values
// must be wrapped first): that row receives no gradient.
// requires: weight [num_embeddings, embedding_dim]; indices int64 or int32, every
//   value in [0, num_embeddings); padding_idx in [-1, num_embeddings).
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1);

}  // namespace nd
