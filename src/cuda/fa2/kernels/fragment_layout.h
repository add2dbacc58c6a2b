// Where each lane's ldmatrix row address points and which accumulator element it holds, for
// fa2's warp-level tiles: plain index functions, used by the kernel and replayed on the CPU by
// tests/cuda/fa2/fragment_layout_test.cc against an emulation of ldmatrix and mma.m16n8k16 (the PTX
// ISA's fragment layouts), so the index math is checked without a GPU.
#pragma once

#include "core/hd.h"

namespace kvattn::fa2::frag {

struct RowCol {
  int row;
  int col;
};

// Element offset of (row, col) in a [rows x D] 16-bit tile whose 16-byte chunks are XOR-swizzled
// by row % 8: the 8 rows one ldmatrix phase reads hit 8 different bank groups. D must be a
// multiple of 64 so that the XOR stays inside the row.
KVATTN_HD int swizzled(int row, int col, int head_dim) {
  return row * head_dim + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// A operand of S = Q K^T, k-step ks (dims 16ks..16ks+15), warp w's 16 rows: lanes 0-15 give rows
// 0-15 at dims +0, lanes 16-31 rows 0-15 at dims +8 (matrices a0..a3).
KVATTN_HD RowCol q_ldmatrix(int warp, int lane, int ks) {
  return RowCol{warp * 16 + (lane & 15), ks * 16 + (lane >> 4) * 8};
}
// B operands of S for keys 16 nt2 .. +15 at k-step ks, from K stored [key][dim]: matrices
// (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15),
// i.e. b0, b1 of n-tile 2 nt2 and b0, b1 of n-tile 2 nt2 + 1.
KVATTN_HD RowCol k_ldmatrix(int lane, int nt2, int ks) {
  return RowCol{nt2 * 16 + (lane & 7) + (lane >> 4) * 8, ks * 16 + ((lane >> 3) & 1) * 8};
}
// B operands of O += P V for keys 16 kk .. +15 and dims 16 dt2 .. +15, from V stored [key][dim]
// with ldmatrix.trans: matrices (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, dims
// 8-15), (keys 8-15, dims 8-15), i.e. b0, b1 of dim tile 2 dt2 and of dim tile 2 dt2 + 1.
KVATTN_HD RowCol v_ldmatrix_trans(int lane, int kk, int dt2) {
  return RowCol{kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dt2 * 16 + (lane >> 4) * 8};
}
// Accumulator element e (0..3) of an m16n8 f32 tile held by `lane`: rows g and g + 8, columns
// 2t and 2t + 1, with g = lane / 4 and t = lane % 4.
KVATTN_HD RowCol acc_element(int lane, int e) {
  return RowCol{(lane >> 2) + (e >> 1) * 8, (lane & 3) * 2 + (e & 1)};
}

}  // namespace kvattn::fa2::frag
