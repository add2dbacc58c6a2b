// Which (row, column) of a wgmma m64nNk16 tile each thread of a warpgroup holds (PTX ISA "Matrix
// Fragments for wgmma.mma_async.m64nNk16"), as plain index functions the kernel and the CPU replay
// (tests/cuda/fa3_wgmma_fragment_test.cc) share. Warp w of the warpgroup owns rows 16w .. 16w+15;
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

// The row statistics of online softmax: a thread's accumulator registers cover two rows (the
// "half" (i / 2) % 2), shared with the three other threads of its quad (same g), which a row
// reduction combines with shuffles over lane bits 0 and 1 (xor 1, xor 2).
KVATTN_HD constexpr int acc_row_half(int i) { return (i / 2) % 2; }

}  // namespace kvattn::fa3::frag
