// FP8 V transposed into V^T [dim][key] (FP8 wgmma reads B K-major only: kv_copies.h's
// copy_v_transposed) with shared-memory stores free of bank conflicts. Which lane loads which
// key rows, which dims it stores in which order, and the byte transpose, as plain functions the
// kernel and the CPU replay share (tests/cuda/fa3/fa3_v_transpose_test.cc checks them).
//
// A V^T row (one dim) of a block is BN bytes of keys, renumbered as P's FP8 A fragment needs
// (wgmma_fragment.h: column c stands for key 32 (c / 32) + fp8_key_of_column(c % 32)), in a
// 128-byte swizzled panel row (smem_layout.h's tile_offset8). Its 32-bit word w (columns 4w ..
// 4w + 3) holds keys {k, k + 1, k + 8, k + 9} of one 32-key group: a "quad". A lane of the
// producer takes one quad and one 8-byte piece of dims (a "unit"): it loads the piece of each of
// the quad's four keys (8-byte loads; the rows' addresses located once per block, one lane per
// row), turns the 4 x 8 bytes into 8 words of 4 keys by byte permutes (two prmt levels per 4
// dims), and stores each word into its dim's row: 8 32-bit stores per 32 bytes, where the
// byte-by-byte transpose before took 32 one-byte stores with 8-way bank conflicts (a warp's
// bytes landed in 4 columns of 8 rows 16 dims apart, which the swizzle, by row mod 8, puts in
// one bank). Pieces of 8 bytes, not 16: 4 x 16 bytes in registers spilled at the producer's 40
// registers (ptxas sm_90a: 56 bytes in e4m3 d128). A warp's load instruction still reads whole
// 32-byte sectors: the lanes of one quad take 4 consecutive pieces of a row.
//
// No conflict: the bank of word w of dim row d is w ^ ((d mod 8) << 2) (128-byte rows; the swizzle
// XORs the 16-byte chunk with d mod 8). Warp v of the producer locates rows [v BN / 4, (v + 1) BN
// / 4) as for K (for_each_chunk: one lane per row, the same hoisted row index: a second one spilled
// at the producer's 40 registers), i.e. the quads of words [v Q, (v + 1) Q) (Q = 8 at BN 128, 4
// at BN 64). One store instruction of its lanes covers all Q quads (word bits 0-2, or 0-1) and 4
// (or 8) pieces, whose "order" permutes the piece's 8 dims by XOR: bits 0-1 inside each 4-dim word
// (folded into the prmt selectors at no cost), bit 2 by exchanging the piece's two words (a select
// per word). The orders of a step's pieces are {0, 2, 4, 6} at BN 128 (bank bits 3-4; bit 2 is the
// quad's) and 0..7 at BN 64 (bank bits 2-4), so the 32 lanes of every store hit 32 distinct banks:
// one wavefront.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"

namespace kvattn::fa3::vt {

inline constexpr int kWarps = 4;  // the producer warpgroup's

// __byte_perm (PTX prmt, default mode): byte i of the result is byte (s >> 4i) & 7 of the 8
// bytes y:x (x the low four).
KVATTN_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(y) << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t(v >> (8 * ((s >> (4 * i)) & 7u)) & 0xFFu) << (8 * i);
  return r;
#endif
}

// The block key V^T's column c (0 .. BN - 1) stands for.
KVATTN_HD constexpr int key_of_column(int c) {
  return c / 32 * 32 + frag::fp8_key_of_column(c % 32);
}

// Quads a warp takes (BN / 4 words a row over 4 warps).
template <int BN>
inline constexpr int kWarpQuads = BN / 4 / kWarps;

// The V^T word of quad i (0 .. kWarpQuads - 1) of warp `warp`: the words of its rows.
template <int BN>
KVATTN_HD constexpr int quad_word(int warp, int i) {
  return kWarpQuads<BN> * warp + i;
}
// The lane of the warp that located key b (0..3) of quad i: its row is warp * BN / 4 + lane.
KVATTN_HD constexpr int key_lane(int i, int b) { return frag::fp8_key_of_column(4 * i + b); }

// Unit u (0 .. kWarpQuads x VO / 8 - 1) of a warp: its quad and its 8-byte piece of dims. Step s
// of the warp's loop runs units 32 s + lane.
struct Unit {
  int quad;
  int piece;
};
template <int BN>
KVATTN_HD constexpr Unit unit(unsigned u) {
  return Unit{int(u % unsigned(kWarpQuads<BN>)), int(u / unsigned(kWarpQuads<BN>))};
}

// Store j (0 .. 7) of a unit writes dim 8 piece + (j ^ order(piece)) (see the header).
template <int BN>
KVATTN_HD constexpr int dim_order(int piece) {
  return BN == 64 ? piece & 7 : (piece & 3) << 1;
}
template <int BN>
KVATTN_HD constexpr int store_dim(int piece, int j) {
  return 8 * piece + (j ^ dim_order<BN>(piece));
}

// Byte offset of store j of a unit in V^T [VO dims x BN keys] (tile_offset8 of store_dim(piece,
// j), column 4 word): store 0's offset XOR a constant of j. The offset's fields lie in disjoint
// bits (the piece's 1024-byte run of 8 rows from bit 10, the row in it in bits 7-9, the word in
// bits 2-6 XORed with the row mod 8 in bits 4-6), and j moves the row by XOR (j ^ order), so XOR
// composes: one LOP3 per store for tile_offset8's multiply, mask and shift (and the producer's
// registers: it runs at 40).
template <int BN, int VO>
KVATTN_HD constexpr uint32_t store0_offset(Unit unit, int word) {
  return smem::tile_offset8(store_dim<BN>(unit.piece, 0), 4 * word, VO);
}
KVATTN_HD constexpr uint32_t store_offset(uint32_t offset0, int j) {
  return offset0 ^ smem::swizzle128(uint32_t(smem::kRowBytes * j));
}

// The prmt selectors of a unit of dim order `order`: level 1 pairs keys (0, 1) and (2, 3) over
// two dims (0x5140: bytes 0, 1 of both; 0x7362: bytes 2, 3), level 2 joins the pairs into 4-key
// words (0x5410: the low pair halves; 0x7632: the high ones); XOR 0x2222 swaps the halves, which
// is how the order's bits 1 and 0 move the dims.
struct Selectors {
  uint32_t pair_lo, join_lo;
};
KVATTN_HD constexpr Selectors selectors(int order) {
  return Selectors{0x5140u ^ ((order >> 1) & 1 ? 0x2222u : 0u),
                   0x5410u ^ (order & 1 ? 0x2222u : 0u)};
}

// FP8 V staged by TMA (kv_copies.h's stage_v_transposed): the lanes of one quarter-warp phase of
// an 8-byte load take 8 quads (BN 128) at one 16-byte chunk of their key rows; key b of quad i is
// row 16 (i / 4) + 8 (b / 2) + 2 (i % 4) + b % 2 (key_lane), so at a fixed b the quads i and i + 4
// share the row's residue mod 8, hence the swizzled chunk: a 2-way conflict. The quads of the
// second half (i / 4 odd) load the keys in the order b ^ 1, which makes the 8 residues distinct.
// (At BN 64 a warp has 4 quads, all of the first half: their 4 rows read 2 chunks each, 8
// distinct ones after the swizzle.)
KVATTN_HD constexpr int load_half(int quad) { return (quad >> 2) & 1; }
// The selectors for keys loaded in the order b ^ half: exchanging keys 0 and 1 (and 2 and 3) is
// exchanging prmt's two source words in level 1, i.e. XOR 0x4444 of its selector.
KVATTN_HD constexpr Selectors staged_selectors(int order, int half) {
  const Selectors s = selectors(order);
  return Selectors{s.pair_lo ^ (half != 0 ? 0x4444u : 0u), s.join_lo};
}

// Word g (dims 4g .. 4g + 3 of the piece, in the unit's order) of keys k0..k3 turned into the
// four 4-key words of those dims: out[e] is dim 4g + (e ^ (order & 3)), byte b from key k_b.
KVATTN_HD void transpose4(uint32_t k0, uint32_t k1, uint32_t k2, uint32_t k3, Selectors s,
                          uint32_t out[4]) {
  const uint32_t lo01 = byte_perm(k0, k1, s.pair_lo), hi01 = byte_perm(k0, k1, s.pair_lo ^ 0x2222u);
  const uint32_t lo23 = byte_perm(k2, k3, s.pair_lo), hi23 = byte_perm(k2, k3, s.pair_lo ^ 0x2222u);
  out[0] = byte_perm(lo01, lo23, s.join_lo);
  out[1] = byte_perm(lo01, lo23, s.join_lo ^ 0x2222u);
  out[2] = byte_perm(hi01, hi23, s.join_lo);
  out[3] = byte_perm(hi01, hi23, s.join_lo ^ 0x2222u);
}

}  // namespace kvattn::fa3::vt
