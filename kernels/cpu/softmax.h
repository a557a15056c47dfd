#pragma once
// Softmax and log-softmax over the last dimension of [M, D], numerically stable
// (the row maximum is subtracted before exponentiating).
#include <cstdint>

namespace nd::kernels::cpu {

// y[m,d] = exp(x[m,d] - max_m) / sum_e exp(x[m,e] - max_m)
// requires: x, y [M, D], D > 0.  ensures: writes y.  in-place: y may equal x.
template <typename T>
void softmax_forward(const T* x, int64_t M, int64_t D, T* y);

// y[m,d] = x[m,d] - max_m - log(sum_e exp(x[m,e] - max_m))
// requires: x, y [M, D], D > 0.  ensures: writes y.  in-place: y may equal x.
template <typename T>
void log_softmax_forward(const T* x, int64_t M, int64_t D, T* y);

// Given the forward output y:  dx = y * (dy - sum_d dy * y)
// requires: dy, y, dx [M, D].  ensures: writes dx.  in-place: dx may equal dy (not y).
template <typename T>
void softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx);

// Given the forward output y = log_softmax(x):  dx = dy - exp(y) * sum_d dy
// requires: dy, y, dx [M, D].  ensures: writes dx.  in-place: dx may equal dy (not y).
template <typename T>
void log_softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx);

}  // namespace nd::kernels::cpu
