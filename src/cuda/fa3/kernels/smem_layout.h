// Shared-memory layouts of fa3's Q, K and V tiles and the wgmma matrix descriptors that read
// them. Every tile is stored as "panels" of 64 16-bit columns (128 bytes per row, the widest row
// TMA's 128-byte swizzle takes): panel p holds columns [64p, 64p + 64) of all rows, row r at byte
// 128 r, with the 128-byte swizzle (CuTe's Swizzle<3,4,3>): the 16-byte chunk index (address bits
// 4-6) is XORed with the row within the 1024-byte atom (bits 7-9). TMA with
// CU_TENSOR_MAP_SWIZZLE_128B writes exactly this pattern when the tile base is 1024-byte aligned,
// and wgmma applies the same XOR to the addresses it forms from a descriptor with layout type
// "128B swizzle", so the producer's writes and the consumer's reads agree by construction of the
// addresses below; tests/cuda/fa3/fa3_smem_layout_test.cc replays both sides (and an emulated wgmma)
// on the CPU.
//
// Q [kBlockM x D] and K [kBlockN x D] are K-major operands (the reduction dim, the head dim, is
// contiguous); V [kBlockN x D] is the B operand of O = P V with N = head dim contiguous, i.e.
// MN-major ("transposed" B, which wgmma allows for 16-bit types).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::fa3::smem {

inline constexpr int kRowBytes = 128;             // one swizzled row of a panel
inline constexpr int kAtomBytes = 8 * kRowBytes;  // 8 rows: the swizzle's period, and its alignment
inline constexpr int kPanelCols16 = 64;           // 16-bit columns per panel

// The 128-byte swizzle on a byte offset from a 1024-byte aligned base.
KVATTN_HD constexpr uint32_t swizzle128(uint32_t byte_offset) {
  return byte_offset ^ (((byte_offset >> 7) & 7u) << 4);
}

// Byte offset of 16-bit element (row, col) in a [rows x cols] tile of 64-column panels; what the
// producer (TMA, or cp.async for pages) writes and what the epilogue and tests read.
KVATTN_HD constexpr uint32_t tile_offset(int row, int col, int rows) {
  const uint32_t logical = uint32_t(col / kPanelCols16) * uint32_t(rows) * kRowBytes +
                           uint32_t(row) * kRowBytes + uint32_t(col % kPanelCols16) * 2u;
  return swizzle128(logical);
}
// The same for 8-bit (FP8) tiles: 128 columns per panel.
KVATTN_HD constexpr uint32_t tile_offset8(int row, int col, int rows) {
  return swizzle128(uint32_t(col / kRowBytes) * uint32_t(rows) * kRowBytes +
                    uint32_t(row) * kRowBytes + uint32_t(col % kRowBytes));
}
// Bytes a tile row takes in whole 128-byte panels: FP8 rows of 64 or 192 bytes (head dims 64 and
// 192; V^T's 64 keys at head dim 256) are padded to 128 / 256, which tile_offset8 leaves unused
// and wgmma's k-steps never read (they stop at the row's real bytes).
KVATTN_HD constexpr uint32_t padded_row_bytes(int bytes) {
  return uint32_t((bytes + kRowBytes - 1) / kRowBytes * kRowBytes);
}
KVATTN_HD constexpr uint32_t tile_bytes(int rows, int cols) {
  return uint32_t(rows) * uint32_t(cols) * 2u;
}

// Where the TMA box of panel `panel` (64 columns x `rows` rows, 128-byte swizzle) goes: TMA
// writes box row r, column c at swizzle128(r * 128 + 2 c) from a 1024-byte aligned destination,
// which is tile_offset's pattern (tested).
KVATTN_HD constexpr uint32_t tma_panel_offset(int panel, int rows) {
  return uint32_t(panel) * uint32_t(rows) * kRowBytes;
}

// A wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address,
// leading- and stride-dimension byte offsets (all >> 4), base offset 0 (tiles are 1024-byte
// aligned) and the layout type in bits 62-63 (1: 128-byte swizzle).
struct Desc {
  uint32_t start = 0;  // shared-memory byte address
  uint32_t lbo = 0;
  uint32_t sbo = 0;
};
inline constexpr uint64_t kLayout128B = 1;

KVATTN_HD constexpr uint64_t encode(const Desc& d) {
  return uint64_t((d.start >> 4) & 0x3FFFu) | (uint64_t((d.lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((d.sbo >> 4) & 0x3FFFu) << 32) | (kLayout128B << 62);
}
KVATTN_HD constexpr Desc decode(uint64_t bits) {
  return Desc{uint32_t(bits & 0x3FFFu) << 4, uint32_t((bits >> 16) & 0x3FFFu) << 4,
              uint32_t((bits >> 32) & 0x3FFFu) << 4};
}

// K-major operand (Q as A, K as B of S = Q K^T), k-step ks (head dims [16 ks, 16 ks + 16)), rows
// [64 m0_block, ...) of a [rows x D] tile at `base`: the 8-row groups are 1024 bytes apart (SBO);
// LBO is unused for a swizzled K-major operand whose k-step lies inside one 128-byte row.
KVATTN_HD constexpr Desc k_major(uint32_t base, int rows, int first_row, int ks) {
  const int col = ks * 16;
  return Desc{base + uint32_t(col / kPanelCols16) * uint32_t(rows) * kRowBytes +
                  uint32_t(first_row) * kRowBytes + uint32_t(col % kPanelCols16) * 2u,
              16u, uint32_t(kAtomBytes)};
}
// MN-major B operand (V of O = P V), keys [16 kk, 16 kk + 16): N (head dim) runs along a row,
// 64 columns per panel, panels `rows` * 128 bytes apart (LBO); the 8-key groups are 1024 bytes
// apart (SBO).
KVATTN_HD constexpr Desc mn_major(uint32_t base, int rows, int kk) {
  return Desc{base + uint32_t(kk) * 16u * kRowBytes, uint32_t(rows) * kRowBytes,
              uint32_t(kAtomBytes)};
}

// Descriptors advanced, not rebuilt (CUTLASS's descriptor iterator, as FA3's mainloop uses it):
// a k-step's descriptor is k-step 0's with the start address moved by the k-step's offset, a
// constant. The start field (bits 0-13, address >> 4) never carries into the LBO field: shared
// memory addresses are below 2^18 bytes (228 KB per SM), so one 32-bit add on the low word.
// tests/cuda/fa3/fa3_smem_layout_test.cc checks advance == encode for every k-step of every tile
// at every 16-byte aligned base up to the shared memory's end.
KVATTN_HD constexpr uint32_t k_major_step(int rows, int ks) {
  return k_major(0, rows, 0, ks).start >> 4;
}
KVATTN_HD constexpr uint32_t mn_major_step(int rows, int kk) {
  return mn_major(0, rows, kk).start >> 4;
}
KVATTN_HD constexpr uint64_t advance(uint64_t desc, uint32_t step) {
  return (desc & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(desc) + step);
}

// Where wgmma reads element (mn, k) of a 16-deep k-step through descriptor `d` (the canonical
// layouts of the PTX ISA for the 128-byte swizzle, 16-bit elements, T = 8 elements per 16 bytes):
//   K-major  ((8, m), (T, 2)) : ((8T, SBO), (1, T))     — before the swizzle, in elements
//   MN-major ((T, 8, m), (8, 2)) : ((1, T, LBO), (8T, SBO))
// The swizzle applies to the address bits, which is why the tiles are 1024-byte aligned and a
// k-step inside an atom moves the start address by whole 16-byte chunks.
// elem_bytes 1: the FP8 (k32) form, T = 16 elements; a k-step is 32 bytes either way, so the
// descriptors k_major() builds serve 8-bit tiles too (k-step ks = columns [32 ks, 32 ks + 32)).
KVATTN_HD constexpr uint32_t k_major_address(const Desc& d, int mn, int k, int elem_bytes = 2) {
  return swizzle128(d.start + uint32_t(mn % 8) * kRowBytes + uint32_t(mn / 8) * d.sbo +
                    uint32_t(k) * uint32_t(elem_bytes));
}
KVATTN_HD constexpr uint32_t mn_major_address(const Desc& d, int mn, int k) {
  return swizzle128(d.start + uint32_t(mn % 64) * 2u + uint32_t(mn / 64) * d.lbo +
                    uint32_t(k % 8) * kRowBytes + uint32_t(k / 8) * d.sbo);
}

// cp.async producer for paged K/V (one 16-byte chunk per thread per step): thread `t` of
// `threads` copies, at step s, chunk c = s * threads + t of the [rows x D] tile, i.e. row
// c / (D / 8), 8 columns starting at 8 (c % (D / 8)). Consecutive lanes take consecutive chunks
// of a row, so each 8-lane phase of a warp's 16-byte stores covers one 128-byte panel row or
// eight distinct chunk positions: distinct banks after the swizzle (tested).
struct Chunk {
  int row;
  int col;
};
KVATTN_HD constexpr Chunk copy_chunk(int chunk, int head_dim) {
  const int per_row = head_dim / 8;
  return Chunk{chunk / per_row, (chunk % per_row) * 8};
}

}  // namespace kvattn::fa3::smem
