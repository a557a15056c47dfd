#pragma once
// Where attention's operands lie and its optional mask, shared by the CPU kernels
// (kernels/cpu/attention.h, which gives the contract) and the CUDA kernels.
#include <cstdint>

namespace nd::kernels {

// Optional additive mask, broadcast by strides (0 = broadcast): element (b, h, i, j) is
// data[b*stride_b + h*stride_h + i*stride_q + j*stride_k]. -inf removes a key.
// data == nullptr means no mask.
template <typename T>
struct AttentionMask {
  const T* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_k = 0;
};

// Where the rows of a [B, H, S, X] operand lie: row (b, h, i) starts at element
// b*stride_b + h*stride_h + i*stride_row and its X elements are contiguous. A view such as
// [B, S, H, X].transpose(1, 2) (MultiheadAttention's heads) is read and written in place.
struct AttentionRows {
  int64_t stride_b = 0, stride_h = 0, stride_row = 0;
  static AttentionRows contiguous(int64_t H, int64_t S, int64_t X) { return {H * S * X, S * X, X}; }
};

// Row layouts of the operands (logsumexp is always a dense [B, H, Sq]). The forward reads
// q, k, v, out; the backward all eight (dq, dk, dv like q, k, v in shape).
struct AttentionLayout {
  AttentionRows q, k, v, out, dout, dq, dk, dv;
  // Every operand dense [B, H, S, X], as the CUDA kernels take them.
  static AttentionLayout contiguous(int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev) {
    const AttentionRows q = AttentionRows::contiguous(H, Sq, E), k = AttentionRows::contiguous(H, Sk, E),
                        v = AttentionRows::contiguous(H, Sk, Ev), o = AttentionRows::contiguous(H, Sq, Ev);
    return {q, k, v, o, o, q, k, v};
  }
};

}  // namespace nd::kernels
