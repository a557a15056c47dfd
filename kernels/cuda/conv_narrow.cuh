#pragma once
// The narrow conv kernels (conv_narrow.cu): the passes of a conv2d with ONE input channel
// or ONE output channel, which conv.cu's launchers hand over instead of running their
// 64 x 64 tile GEMM (see conv_narrow.cu for why). In conv2d terms, s.C_in == 1 (so
// groups == 1) or s.C_out == 1 (groups == 1):
//   forward  y = conv(x, w) + bias      conv2d's forward, conv_transpose2d's input gradient
//   dgrad    dx = conv^T(dy, w) + bias  conv2d's input gradient, conv_transpose2d's forward
//   wgrad    dw = dy (x) x               both ops' weight gradient
// Same arguments and contracts as conv.cu's passes (kernels/cuda/conv.h); the caller has
// checked the operands (bf16 / f16 on float only) and returned early on empty outputs.
#include "kernels/cuda/conv.h"

namespace nd::kernels::cuda::narrow {

// Whether the narrow kernels run conv2d s (every pass): one input channel, or one output
// channel (groups 1).
inline bool applies(const Conv2dShape& s) { return s.C_in == 1 || (s.C_out == 1 && s.groups == 1); }

// requires: applies(s), N * OH * OW > 0.
template <class T>
void forward(const char* kernel, const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y,
             ConvOperands operands, cudaStream_t stream);

// requires: applies(s), N * H * W > 0. bias: [C_in] (conv_transpose2d's) or nullptr.
template <class T>
void dgrad(const char* kernel, const Conv2dShape& s, const T* dy, const T* w, const T* bias, T* dx,
           ConvOperands operands, cudaStream_t stream);

// requires: applies(s), N * OH * OW > 0. Uses a partial buffer from the caching
// allocator when the depth N * OH * OW is cut into chunks.
template <class T>
void wgrad(const char* kernel, const Conv2dShape& s, const T* x, const T* dy, T* dw, ConvOperands operands,
           cudaStream_t stream);

}  // namespace nd::kernels::cuda::narrow
