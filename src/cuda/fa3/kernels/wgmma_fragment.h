// Which (row, column) of a wgmma m64nNk16 tile each thread of a warpgroup holds (PTX ISA "Matrix
// Fragments for wgmma.mma_async.m64nNk16"), as plain index functions the kernel and the CPU replay
// (tests/cuda/fa3/fa3_smem_layout_test.cc) share. Warp w of the warpgroup owns rows 16w .. 16w+15;
// inside a warp the layout repeats mma.m16n8k16's, with g = lane / 4 and t = lane % 4:
//   accumulator (f32, N/2 registers): d_i at row 16w + g + 8 ((i / 2) % 2), column 8 (i / 4) +
//     2t + i % 2;
//   A from registers (16-bit, four b32 registers of two halves): a_r half h at row 16w + g +
//     8 (r % 2), column 2t + h + 8 (r / 2).
// So the S accumulator of one K/V block becomes the A operand of O = P V with no data movement
// across threads: k-step kk of P (keys 16 kk .. +15) is made of accumulator registers 8 kk .. +7
// (p_a_register below).
#pragma once

#include "core/hd.h"

namespace kvattn::fa3::frag {

inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kWarpgroupRows = 64;

struct RowCol {
  int row;
  int col;
};

// Accumulator register i of thread `tid` (0..127 within the warpgroup).
KVATTN_HD constexpr RowCol acc_element(int tid, int i) {
  const int warp = tid / 32, lane = tid % 32;
  return RowCol{16 * warp + lane / 4 + 8 * ((i / 2) % 2), 8 * (i / 4) + 2 * (lane % 4) + i % 2};
}

// Element h (0, 1) of A register r (0..3) of thread `tid`, for one k16 step.
KVATTN_HD constexpr RowCol a_element(int tid, int r, int h) {
  const int warp = tid / 32, lane = tid % 32;
  return RowCol{16 * warp + lane / 4 + 8 * (r % 2), 2 * (lane % 4) + h + 8 * (r / 2)};
}

// The accumulator register of S (one K/V block, N = keys) that becomes element h of A register r
// of P's k-step kk: same thread, same row, key 16 kk + (A's column).
KVATTN_HD constexpr int p_a_register(int kk, int r, int h) {
  return 8 * kk + 4 * (r / 2) + 2 * (r % 2) + h;
}

// FP8 (wgmma m64nNk32, e4m3/e5m2): byte b (0..3) of A register r (0..3) of thread `tid` holds
// row 16w + g + 8 (r % 2), column 4t + b + 16 (r / 2) of the 32-deep k-step. FP8 wgmma takes B
// K-major only, so V is stored transposed ([dim][key]); and a thread's S accumulators hold keys
// 2t, 2t+1 (+8 j), not the A fragment's 4t .. 4t+3, so rather than exchanging registers the
// keys are renumbered: A column c of k-step kk stands for key 32 kk + fp8_key_of_column(c), and
// the producer writes V^T's column c from that key. P V is a sum over keys, so any one-to-one
// renumbering used by both sides gives the same result (tests/cuda/fa3/fa3_smem_layout_test.cc).
KVATTN_HD constexpr RowCol a_element8(int tid, int r, int b) {
  const int warp = tid / 32, lane = tid % 32;
  return RowCol{16 * warp + lane / 4 + 8 * (r % 2), 4 * (lane % 4) + b + 16 * (r / 2)};
}
// The S accumulator register that becomes byte b of A register r of P's k-step kk (FP8).
KVATTN_HD constexpr int p_a_register8(int kk, int r, int b) {
  return 16 * kk + 4 * (2 * (r / 2) + b / 2) + 2 * (r % 2) + b % 2;
}
// Column c (0..31) of an FP8 k-step -> the key (0..31 within the k-step) it stands for, and back.
KVATTN_HD constexpr int fp8_key_of_column(int c) {
  const int h = c / 16, t = (c % 16) / 4, b = c % 4;
  return 16 * h + 8 * (b / 2) + 2 * t + b % 2;
}
KVATTN_HD constexpr int fp8_column_of_key(int key) {
  const int h = key / 16, b = 2 * ((key % 16) / 8) + key % 2, t = (key % 8) / 2;
  return 16 * h + 4 * t + b;
}

// The row statistics of online softmax: a thread's accumulator registers cover two rows (the
// "half" (i / 2) % 2), shared with the three other threads of its quad (same g), which a row
// reduction combines with shuffles over lane bits 0 and 1 (xor 1, xor 2).
KVATTN_HD constexpr int acc_row_half(int i) { return (i / 2) % 2; }

}  // namespace kvattn::fa3::frag
