// fa3's tile shape per kernel key: one constexpr function that the planner (backend.cc's chunk
// size, kernel_params.cc's tile list and TMA boxes), the kernel (cta_layout.h's shared-memory plan
// and mainloop) and the tests all read (STYLE.md "One source of truth"; FlashAttention-3's
// hopper/tile_size.h is the model: one function from the head dims and the element size to the
// block shape and the mainloop's form).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::fa3 {

struct TileShape {
  // Query rows of a CTA's tile: two consumer warpgroups of 64 rows (the M of one wgmma each).
  int block_m;
  // Keys per K/V block: the N of S = Q K^T, and the depth of O += P V.
  int block_n;
  // Slots of the K ring and of the V ring (pipeline_state.h).
  int stages;
  // Softmax of block n overlapped with O += P V of block n - 1 (FA3's intra-warpgroup overlap).
  bool intra_wg_overlap;
};

// Why these values (registers per consumer thread, 232 with setmaxnreg; ptxas sm_90a):
// - block_n 128 below head dim 256: S takes 64 accumulators, O head_dim / 2, P 32 (16-bit); at
//   head dim 256 a 128-key S and a 256-wide O (64 + 128 + 32 with the overlap's second P) do not
//   fit, so 64 keys. (FA3 also tunes 176 / 192 / 80 keys per head dim; those need wgmma N that are
//   not multiples of this kernel's 64-column panels: not here.)
// - stages 2: with separate K and V rings a block of lookahead in steady state, and the 16-bit
//   (192,128) tile (Q 2 x 24 KB, K 48 KB, V 32 KB per stage) already takes 214 KB of the 227 KB
//   a CTA may have; a third stage does not fit there.
// - FP8 keeps the blocks apart: with S, P and O live at once its consumers spill (64 bytes), and
//   its P is half the registers that would pay for it (prefill_cta.h).
KVATTN_HD constexpr TileShape tile_shape(int head_dim_qk, int head_dim_vo, int elem_bytes) {
  (void)head_dim_vo;  // O's width enters through head_dim_qk: the declared pairs have VO <= QK
  return TileShape{128, head_dim_qk >= 256 ? 64 : 128, 2, elem_bytes == 2};
}

// Consumer warpgroups a launch needs: each takes 64 rows of a tile (the M of one wgmma), so one
// when no request has more than 64 (packed) rows: every tile's rows then lie in the first
// warpgroup's half, and the second would compute only on padding (decode: a token's GQA group).
KVATTN_HD constexpr int consumer_warpgroups(const TileShape& t, int64_t max_packed_rows) {
  return max_packed_rows <= t.block_m / 2 ? 1 : 2;
}

}  // namespace kvattn::fa3
