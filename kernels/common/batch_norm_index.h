#pragma once
// Index math of the CUDA batch-norm kernels over an [N, C, S] array, kept here (it
// compiles with and without nvcc) so that tests/kernels/welford_test.cpp checks it on
// the CPU against the plain formulas:
//   value j of channel c (0 <= j < N*S) is element ((j / S) * C + c) * S + j % S;
//   element i belongs to channel (i / S) % C.
// The walks advance by a fixed stride with additions only: a 64-bit division per value
// would cost more than the memory traffic these kernels are bound by.
#include <cstdint>

#include "kernels/common/host_device.h"

namespace nd::kernels {

// The fixed split of a channel's `values` into chunks, one thread block each: chunk k
// holds values [k * length, min(values, (k + 1) * length)). Depends on the sizes only,
// so the reduction order (and every bit of the result) is the same run to run.
struct ChannelChunks {
  int64_t count;   // >= 1; no chunk is empty unless values == 0 (then one empty chunk)
  int64_t length;  // values per chunk (the last may hold fewer)
};

// About `target_length` values per chunk, at most `max_chunks` chunks.
// requires: target_length >= 1, max_chunks >= 1.
ND_HOST_DEVICE ChannelChunks channel_chunks(int64_t values, int64_t target_length, int64_t max_chunks) {
  if (values <= 0) return ChannelChunks{1, 0};
  int64_t count = (values + target_length - 1) / target_length;
  if (count > max_chunks) count = max_chunks;
  const int64_t length = (values + count - 1) / count;
  return ChannelChunks{(values + length - 1) / length, length};
}

// Visits values j, j + step, j + 2 step, ... of channel c: `offset` is the current
// value's element index. From j to j + step (step = step_n * S + step_s, step_s < S):
//   offset += step_n * C * S + step_s, and when the plane position s passes S it wraps
//   to the next plane of the same channel: s -= S, offset += (C - 1) * S.
struct ChannelWalk {
  int64_t offset, s;
  int64_t jump, step_s, wrap, S;
  ND_HOST_DEVICE void next() {
    offset += jump;
    s += step_s;
    if (s >= S) {
      s -= S;
      offset += wrap;
    }
  }
};

// requires: S >= 1, C >= 1, 0 <= c < C, j >= 0, step >= 1.
ND_HOST_DEVICE ChannelWalk channel_walk(int64_t j, int64_t step, int64_t C, int64_t S, int64_t c) {
  return ChannelWalk{(j / S * C + c) * S + j % S, j % S, step / S * C * S + step % S, step % S, (C - 1) * S, S};
}

// Visits elements i, i + step, ... keeping c = (i / S) % C. From i to i + step:
//   s = i % S moves by step % S (a carry when it passes S), and c moves by
//   (step / S) % C plus the carry, wrapping once at C (it stays below 2C).
struct ElementWalk {
  int64_t i, s, c;
  int64_t step, step_s, step_c, S, C;
  ND_HOST_DEVICE void next() {
    i += step;
    s += step_s;
    int64_t carry = 0;
    if (s >= S) {
      s -= S;
      carry = 1;
    }
    c += step_c + carry;
    if (c >= C) c -= C;
  }
};

// requires: S >= 1, C >= 1, i >= 0, step >= 1.
ND_HOST_DEVICE ElementWalk element_walk(int64_t i, int64_t step, int64_t C, int64_t S) {
  return ElementWalk{i, i % S, i / S % C, step, step % S, step / S % C, S, C};
}

}  // namespace nd::kernels
