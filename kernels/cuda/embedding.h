#pragma once
// CUDA twins of kernels/cpu/embedding.h: gather rows of a [num_embeddings, D] table by
// int64 indices, and the deterministic backward (no float atomics: the indices are sorted
// stably, then each table row sums its gradient rows in index-position order, exactly
// the order of the CPU reference).
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// out[i, :] = weight[indices[i], :]
// requires: weight [num_embeddings, D]; indices [n]; out [n, D]; all on the stream's device.
// ensures: returns -1 and writes out when every index is in [0, num_embeddings);
//          otherwise returns the position i of the first bad index and writes nothing.
//          Waits for the stream (the validity of the indices must be known on return).
template <typename T>
int64_t embedding_forward(const T* weight, int64_t num_embeddings, int64_t D, const int64_t* indices, int64_t n,
                          T* out, cudaStream_t stream);

// dweight[r, :] = sum_{i : indices[i] == r} dout[i, :] (added in increasing i), and 0 for
// r == padding_idx (padding_idx < 0 means none).
// requires: dout [n, D]; indices [n], all in range (checked by the forward); n < 2^31;
//           dweight [num_embeddings, D].
// ensures: writes (not accumulates) all of dweight; deterministic, and bit-equal to the CPU twin.
template <typename T>
void embedding_backward(const T* dout, const int64_t* indices, int64_t n, int64_t num_embeddings, int64_t D,
                        int64_t padding_idx, T* dweight, cudaStream_t stream);

}  // namespace nd::kernels::cuda
