#pragma once
// CUDA twins of kernels/cpu/loss.h: mse_loss, binary_cross_entropy_with_logits and
// cross_entropy, forward and backward, with the same reductions, weights and per-element
// math (kernels/common/loss_math.h, shared with the CPU). Sums are in double in a fixed
// order (per-block partial sums, then one block adds them in block order), so results
// repeat bit for bit from run to run; they differ from the CPU's order only by rounding.
//
// Output sizes follow the reduction: None writes one value per sample, Mean and Sum write
// a single value. Backward takes dout of that same size. All pointers on the stream's device.
#include <cstdint>

#include "kernels/common/loss_math.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

using kernels::LossReduction;

// l_i = (x_i - t_i)^2;  out = l (None), sum_i l_i (Sum), sum_i l_i / n (Mean).
// requires: input, target [n]; out [n] or [1].  ensures: writes out.
template <typename T>
void mse_loss_forward(const T* input, const T* target, int64_t n, LossReduction reduction, T* out,
                      cudaStream_t stream);

// dinput_i = 2 (x_i - t_i) g_i, with g_i = dout_i (None), dout (Sum), dout / n (Mean); dtarget = -dinput.
// requires: dout [n] or [1]; dinput, dtarget [n] or null.  ensures: writes non-null outputs.
template <typename T>
void mse_loss_backward(const T* dout, const T* input, const T* target, int64_t n, LossReduction reduction,
                       T* dinput, T* dtarget, cudaStream_t stream);

// l_i = w_i [ (1 - t_i) x_i + lw_i sp(-x_i) ],  lw_i = 1 + (pos_weight[i % C] - 1) t_i, reduced as mse_loss.
// requires: input, target [n]; weight [n] or null; pos_weight [C] or null (n % C == 0);
//           out [n] or [1].  ensures: writes out.
template <typename T>
void binary_cross_entropy_with_logits_forward(const T* input, const T* target, const T* weight, const T* pos_weight,
                                              int64_t n, int64_t C, LossReduction reduction, T* out,
                                              cudaStream_t stream);

// dl_i/dx_i = w_i [ (1 - t_i) - lw_i sigmoid(-x_i) ],  dl_i/dt_i = w_i [ -x_i + (pos_weight - 1) sp(-x_i) ],
// times g_i as for mse_loss.
// requires: as the forward; dout [n] or [1]; dinput, dtarget [n] or null.  ensures: writes non-null outputs.
template <typename T>
void binary_cross_entropy_with_logits_backward(const T* dout, const T* input, const T* target, const T* weight,
                                               const T* pos_weight, int64_t n, int64_t C, LossReduction reduction,
                                               T* dinput, T* dtarget, cudaStream_t stream);

// Per sample i (one block per row of C logits): lse_i = log sum_c exp(x_ic),
//   l_i = (1 - eps) w_y (lse_i - x_iy) + (eps / C) sum_c w_c (lse_i - x_ic),  0 when y == ignore_index;
// Mean divides by sum_{i not ignored} w_y (NaN when every target is ignored).
// requires: logits [N, C], C > 0; target [N]; weight [C] or null; 0 <= eps <= 1; out [N] or [1]; lse [N].
// ensures: returns -1 and writes out and lse when every target is ignore_index or in [0, C);
//          otherwise returns the first bad position i and writes nothing. Waits for the stream
//          (the validity of the targets must be known on return).
template <typename T>
int64_t cross_entropy_forward(const T* logits, const int64_t* target, const T* weight, int64_t N, int64_t C,
                              int64_t ignore_index, double label_smoothing, LossReduction reduction, T* out, T* lse,
                              cudaStream_t stream);

// dl_i/dx_ic = (1 - eps) w_y (p_ic - [c == y]) + (eps / C) (p_ic sum_k w_k - w_c),  p_ic = exp(x_ic - lse_i)
// (0 for ignored samples), times g_i (dout_i, dout, or dout / sum w_y for Mean).
// requires: the forward's arguments (validated targets) and its lse; dout [N] or [1]; dlogits [N, C].
// ensures: writes dlogits.  in-place: dlogits may equal logits.
template <typename T>
void cross_entropy_backward(const T* dout, const T* logits, const int64_t* target, const T* weight, const T* lse,
                            int64_t N, int64_t C, int64_t ignore_index, double label_smoothing,
                            LossReduction reduction, T* dlogits, cudaStream_t stream);

}  // namespace nd::kernels::cuda
