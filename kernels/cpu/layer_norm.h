#pragma once
// Layer normalisation over the last D elements of [M, D] (PyTorch's native_layer_norm).
#include <cstdint>

namespace nd::kernels::cpu {

// Per row m:  mean = (1/D) sum_d x,  var = (1/D) sum_d (x - mean)^2 (biased),
//             rstd = 1/sqrt(var + eps),  y = (x - mean) * rstd * weight + bias
// (weight = 1, bias = 0 when null).
// requires: x, y [M, D], D > 0; weight, bias [D] or null; mean, rstd [M].
// Statistics are two-pass sums in double (accurate when |mean| >> std).
// ensures: writes y, mean, rstd, the same for any number of threads.  in-place: y may equal x.
template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, int64_t M, int64_t D,
                        double eps, T* y, T* mean, T* rstd);

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx      = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat))
//   dweight = sum_m dy * xhat,   dbias = sum_m dy
// requires: dy, x [M, D]; mean, rstd [M] from layer_norm_forward; weight [D] or null;
//           dx [M, D], dweight, dbias [D], each null when not needed.
// ensures: writes (not accumulates) the non-null outputs, the same for any number of threads
//          (dweight, dbias are 0 when M = 0).  in-place: dx may equal dy.
template <typename T>
void layer_norm_backward(const T* dy, const T* x, const T* mean, const T* rstd, const T* weight,
                         int64_t M, int64_t D, T* dx, T* dweight, T* dbias);

}  // namespace nd::kernels::cpu
