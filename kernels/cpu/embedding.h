#pragma once
// Embedding lookup: gather rows of a [num_embeddings, D] table by int64 indices.
#include <cstdint>

namespace nd::kernels::cpu {

// out[i, :] = weight[indices[i], :]
// requires: weight [num_embeddings, D]; indices [n]; out [n, D].
// ensures: returns -1 and writes out when every index is in [0, num_embeddings);
//          otherwise returns the position i of the first bad index and writes nothing,
//          so the caller can report indices[i].
template <typename T>
int64_t embedding_forward(const T* weight, int64_t num_embeddings, int64_t D,
                          const int64_t* indices, int64_t n, T* out);

// dweight[r, :] = sum_{i : indices[i] == r} dout[i, :], and 0 for r == padding_idx
// (padding_idx < 0 means none; callers map PyTorch's negative padding_idx first).
// requires: dout [n, D]; indices [n], all in range (checked by the forward);
//           dweight [num_embeddings, D].
// ensures: writes (not accumulates) all of dweight; deterministic summation order.
template <typename T>
void embedding_backward(const T* dout, const int64_t* indices, int64_t n, int64_t num_embeddings,
                        int64_t D, int64_t padding_idx, T* dweight);

}  // namespace nd::kernels::cpu
