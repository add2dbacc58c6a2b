// fa3's epilogue: a consumer warpgroup's normalized O tile [64 rows x VO] to global memory in the
// output's type, through shared memory with 16-byte stores (CUTLASS's and FA3's epilogue shape).
// The accumulator fragment spreads a row over a quad of threads, two adjacent columns each, so
// stored straight from registers a row is written 4 or 8 bytes at a time (and, for a runtime
// output type, behind a branch per element). Here each thread writes its fragment, converted to
// the output type, into a staging tile in shared memory, the warpgroup synchronizes, and each
// thread then copies 16-byte chunks of whole rows to global memory: a row of VO elements is
// VO * bytes / 16 vector stores, masked only per row (packed rows past the request's, which
// covers tokens past qo_len and heads past the GQA group).
//
// The staging tile is the warpgroup's own Q tile: once every warp of the warpgroup is past its
// last wgmma (a named barrier after the last wgmma.wait_group), nothing reads it until the next
// tile's Q, which the producer's Q warp copies only once every warp of the warpgroup released the
// tile after this epilogue (prefill_cta.h's empty_q). When an output row does not fit a Q
// row (f32 output, or FP8's 1-byte Q rows) the columns go out in passes, each as wide as a Q row
// allows (a power of two of at least 128 bytes).
//
// Bank conflicts: the staging tile's rows are `kRowBytes` (a multiple of 128) apart, so without a
// swizzle the 8 rows of a fragment store would all hit the same banks. The 16-byte chunk index is
// XORed with (row * quad_chunks) % 8, quad_chunks being the chunks a quad's fragment store covers
// (16-bit: 4 lanes x 4 bytes = 1 chunk; f32: 4 lanes x 8 bytes = 2 chunks): the 16-bit store
// (one phase, rows g = 0..7) then puts its 8 rows' chunks on 8 distinct chunk positions, the f32
// store (st.shared.v2: two phases of 4 rows x 2 chunks) its 4 rows' chunk pairs on 8 distinct
// positions, and the copy's 16-byte reads (a phase is 8 lanes, 8 consecutive chunks of one row)
// the 8 positions of its row: every access one wavefront per phase
// (tests/cuda/fa3/fa3_epilogue_test.cc checks the banks).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "cuda/fa3/kernels/named_barriers.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/pragma.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"

namespace kvattn::cuda {
struct Bf16Tag;
struct F16Tag;
}  // namespace kvattn::cuda

namespace kvattn::fa3::epi {

// Output element types: f32 (out f32, and split-KV's partial states), and the 16-bit tags of
// cuda/common/ptx.cuh (converted by the ops' pack16, round to nearest even).
struct F32Out {};
template <class Out>
struct OutElem {
  static constexpr int kBytes = 2;
};
template <>
struct OutElem<F32Out> {
  static constexpr int kBytes = 4;
};

// Two f32 columns of a fragment: one 8-byte shared store.
struct alignas(8) F2 {
  float x, y;
};

KVATTN_HD constexpr int floor_pow2(int x) {
  int p = 1;
  while (2 * p <= x) p *= 2;
  return p;
}

// Byte `byte_col` of staging row `row`: rows kRowBytes apart, 16-byte chunks swizzled (above).
KVATTN_HD constexpr uint32_t staged_offset(int row, int byte_col, int row_bytes, int elem_bytes) {
  const int quad_chunks = elem_bytes / 2;
  const int chunk = (byte_col / 16) ^ ((row * quad_chunks) % 8);
  return uint32_t(row) * uint32_t(row_bytes) + uint32_t(chunk) * 16u + uint32_t(byte_col % 16);
}

// The passes of an O tile of VO columns of `Out` through a staging tile of 64 rows of at most
// `q_row_bytes` (the Q tile's row).
template <int VO, class Out>
struct Stage {
  static constexpr int kElemBytes = OutElem<Out>::kBytes;
  template <int kQRowBytes>
  static constexpr int pass_cols() {
    const int cols = floor_pow2(kQRowBytes) / kElemBytes;
    return cols < VO ? cols : VO;
  }
};

// Where a tile's output rows go: row (token, qo_head) of the request at base + token *
// token_bytes + qo_head * head_bytes, element d at d * dim_elems elements on; `chunks` when every
// row is 16-byte aligned and dense (then 16-byte stores, else element by element).
struct OutRows {
  uint8_t* base;
  int64_t token_bytes, head_bytes, dim_elems;
  bool chunks;
};

// Writes this warpgroup's O (times inv[h] for row half h) to `dst` through the staging tile
// `stage` (the warpgroup's Q tile, kQRowBytes per row). Every thread of the warpgroup calls it
// (named barrier bar::warpgroup(wg)). Rows at or past `rows` (the request's packed rows) are not
// written.
template <class Out, int VO, int kQRowBytes, class Ops, class OAcc>
KVATTN_HD void store_o(const Ops& ops, const OAcc& o, const float (&inv)[2], uint8_t* stage,
                       const OutRows& dst, int64_t row0, int64_t rows, int tile_head,
                       int rows_per_token, int ctid, int wg) {
  constexpr int E = OutElem<Out>::kBytes;
  constexpr int kPassCols = Stage<VO, Out>::template pass_cols<kQRowBytes>();
  constexpr int kRowBytes = kPassCols * E;
  constexpr int kRowChunks = kRowBytes / 16;
  constexpr int kRows = frag::kWarpgroupRows;
  static_assert(kRowBytes % 128 == 0 && VO % kPassCols == 0 && kRowBytes <= kQRowBytes,
                "a staging row is whole 128-byte lines and fits a Q row");
  const int t = ctid % 4;
  KVATTN_FA3_PRAGMA(unroll)
  for (int pass = 0; pass < VO / kPassCols; ++pass) {
    // Every warp of the warpgroup past its last wgmma (which read Q), or past the previous pass's
    // reads of the staging tile.
    ops.named_barrier_sync(bar::warpgroup(wg), frag::kWarpgroupThreads);
    KVATTN_FA3_PRAGMA(unroll)
    for (int h = 0; h < 2; ++h) {
      const int row = frag::acc_element(ctid, 2 * h).row;
      KVATTN_FA3_PRAGMA(unroll)
      for (int jj = 0; jj < kPassCols / 8; ++jj) {
        // Accumulators 4 j + 2 h and + 1: row half h, columns 8 j + 2 t and + 1.
        const int i = 4 * (pass * kPassCols / 8 + jj) + 2 * h;
        const float v0 = o[i] * inv[h], v1 = o[i + 1] * inv[h];
        uint8_t* at = stage + staged_offset(row, (8 * jj + 2 * t) * E, kRowBytes, E);
        if constexpr (E == 4) {
          ops.st_shared(reinterpret_cast<F2*>(at), F2{v0, v1});
        } else {
          ops.st_shared(reinterpret_cast<uint32_t*>(at), ops.template pack16<Out>(v0, v1));
        }
      }
    }
    ops.named_barrier_sync(bar::warpgroup(wg), frag::kWarpgroupThreads);
    KVATTN_FA3_PRAGMA(unroll 1)
    for (int c = ctid; c < kRows * kRowChunks; c += frag::kWarpgroupThreads) {
      const int row = c / kRowChunks, chunk = c % kRowChunks;
      if (row0 + row >= rows) continue;
      const typename Ops::U4 x = ops.ld_shared(reinterpret_cast<const typename Ops::U4*>(
          stage + staged_offset(row, 16 * chunk, kRowBytes, E)));
      const pack::TokenHead th = pack::token_head(row0 + row, tile_head, rows_per_token);
      uint8_t* out_row = dst.base + th.token * dst.token_bytes + th.qo_head * dst.head_bytes;
      const int col = pass * kPassCols + chunk * (16 / E);  // the chunk's first element
      if (dst.chunks) {
        ops.st_global(reinterpret_cast<typename Ops::U4*>(out_row + int64_t(col) * E), x);
      } else {
        // A strided or misaligned output (params.h's o_chunks): the chunk's elements one by one.
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
        KVATTN_FA3_PRAGMA(unroll)
        for (int e = 0; e < 16 / E; ++e) {
          uint8_t* at = out_row + (col + e) * dst.dim_elems * E;
          if constexpr (E == 4) {
            ops.st_global(reinterpret_cast<uint32_t*>(at), w[e]);
          } else {
            ops.st_global(reinterpret_cast<uint16_t*>(at),
                          uint16_t(e % 2 ? w[e / 2] >> 16 : w[e / 2] & 0xffffu));
          }
        }
      }
    }
  }
}

}  // namespace kvattn::fa3::epi
