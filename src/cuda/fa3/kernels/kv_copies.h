// fa3's K/V copies below the producer's walk (producer.h): where a key's row lies (paged or
// not), TMA box origins, the producer threads' rows of a block, 16-byte chunk copies by cp.async
// or gathers, and FP8 V transposed into V^T (from global memory, or from the TMA staging tile).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "cuda/fa3/kernels/cta_layout.h"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/l2_hint.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/pragma.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/v_transpose.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {


// Where key `key`'s row (kv_head, dim 0) lies. A paged key's page in its request is a division by
// the page size: FastDiv's multiply and shift (ops.fast_div) for keys below 2^32, its 32-bit
// dividends; a 64-bit division past them (a request of more than 2^32 keys: correct, not fast).
// Called once per row of a K/V block (locate_lane_row), not per 16-byte chunk.
// The page of a paged request's key and its slot in it (page_slot), for kv_row and, once per
// block, for the TMA box of a paged block (box_origin).
struct KeyPage {
  int32_t page;
  int64_t slot;
};
template <class Ops>
KVATTN_HD KeyPage page_slot(const Ops& ops, const PrefillParams& p, const RequestInfo& r,
                            int64_t key) {
  const int64_t page_size = p.page_div.divisor;
  const int64_t page_in_request =
      key <= int64_t(UINT32_MAX) ? ops.fast_div(p.page_div, uint32_t(key)) : key / page_size;
  return KeyPage{p.kv_indices[r.kv_first + page_in_request], key - page_in_request * page_size};
}
template <int EB, class Ops>
KVATTN_HD const uint8_t* kv_row(const Ops& ops, const PrefillParams& p, const RequestInfo& r,
                                const void* base, const paged::CacheStrides& s, int64_t key,
                                int kv_head) {
  int64_t off;
  if (p.paged) {
    const KeyPage at = page_slot(ops, p, r, key);
    off = s.offset(at.page, at.slot, kv_head, 0);
  } else {
    off = s.offset(0, r.kv_first + key, kv_head, 0);
  }
  return static_cast<const uint8_t*>(base) + off * EB;
}

// Where block n's TMA box starts in its map (kernel_params.cc's kv_map_spec: D, H_kv, slots,
// pages): dense and ragged, token kv_first + n BN of the one page (< 2^31: tma_coords.h, else no
// map); paged, the block's slot in its page and the page (a map only where the page size is a
// multiple of BN, so a block never crosses a page; the page division once per block).
struct BoxOrigin {
  int slot;
  int page;
};
template <int BN, class Ops>
KVATTN_HD BoxOrigin box_origin(const Ops& ops, const PrefillParams& p, const RequestInfo& r,
                               int n) {
  const int64_t key = int64_t(n) * BN;
  if (!p.paged) return BoxOrigin{int(r.kv_first + key), 0};
  const KeyPage at = page_slot(ops, p, r, key);
  return BoxOrigin{int(at.slot), at.page};
}

// A K/V block [BN rows x kRowChunks 16-byte chunks] is copied warp by warp: warp w of the
// producer takes rows [w * kWarpRows, (w + 1) * kWarpRows), chunk by chunk in row order, 32
// consecutive chunks a step (the steps of one walk of the tile by all 128 threads, in another
// order). Lane l locates row w * kWarpRows + l once per block (kv_row: the page division and the
// page-table load), and every chunk takes its row's address from that lane (two shuffles):
// locating the row per chunk cost a 64-bit division and a page-table load per 16 bytes copied.
template <int BN>
inline constexpr int kWarpRows = BN / kWarpsPerWarpgroup;

// This lane's row of block n; nullptr for a row at or past kv_len, and for a lane past the warp's
// rows (BN 64: 16 rows a warp).
template <int EB, int BN, class Ops>
KVATTN_HD const uint8_t* locate_lane_row(const Ops& ops, const PrefillParams& p,
                                         const RequestInfo& r, const void* base,
                                         const paged::CacheStrides& s, int n, int kv_head,
                                         int tid) {
  const int lane = tid % 32;
  if (lane >= kWarpRows<BN>) return nullptr;
  const int64_t key = int64_t(n) * BN + (tid / 32) * kWarpRows<BN> + lane;
  return key < r.kv_len ? kv_row<EB>(ops, p, r, base, s, key, kv_head) : nullptr;
}

// copy(row, byte_col, src, in) for each chunk of block n that this thread copies: src is the
// row's address, in whether the row is a key (below kv_len); a row past kv_len gets the cache's
// base, a valid address none of whose bytes is read. Not unrolled: with the row addresses held
// across the loop, unrolling by 2 spilled at the producer's 40 registers (ptxas sm_90a: 344 bytes
// of spill stores in bf16 d128, 336 in e4m3 d128).
template <int EB, int BN, int kRowChunks, class Ops, class Copy>
KVATTN_HD void for_each_chunk(const Ops& ops, const PrefillParams& p, const RequestInfo& r,
                              const void* base, const paged::CacheStrides& s, int n, int kv_head,
                              int tid, Copy&& copy) {
  constexpr int kWarpChunks = kWarpRows<BN> * kRowChunks;
  // Every lane takes the same steps, so each reaches every shuffle.
  static_assert(kWarpRows<BN> <= 32 && kWarpChunks % 32 == 0);
  const uintptr_t located =
      reinterpret_cast<uintptr_t>(locate_lane_row<EB, BN>(ops, p, r, base, s, n, kv_head, tid));
  const int row0 = (tid / 32) * kWarpRows<BN>;
  KVATTN_FA3_PRAGMA(unroll 1)
  for (int c = tid % 32; c < kWarpChunks; c += 32) {
    const int local = c / kRowChunks;  // the row's lane
    const uint64_t lo = ops.shfl_u32(uint32_t(located), local);
    const uint64_t hi = ops.shfl_u32(uint32_t(uint64_t(located) >> 32), local);
    const uint8_t* src = reinterpret_cast<const uint8_t*>(uintptr_t(lo | hi << 32));
    const bool in = src != nullptr;
    copy(row0 + local, (c % kRowChunks) * 16, in ? src : static_cast<const uint8_t*>(base), in);
  }
}

// 16 bytes of a row that is not a run of 16-byte chunks (params.h: a strided dim, or a base or
// stride not a multiple of 16 bytes), from its byte `byte_col` on as if the dim were dense: byte
// by byte, so any alignment and any dim stride (elements) run. Only such rows pay for it.
template <int EB, class Ops>
KVATTN_HD typename Ops::U4 gather16(const Ops& ops, const uint8_t* row, int byte_col,
                                    int64_t dim_stride) {
  uint32_t w[4] = {0, 0, 0, 0};
  KVATTN_FA3_PRAGMA(unroll)
  for (int b = 0; b < 16; ++b) {
    const int64_t elem = (byte_col + b) / EB;
    const uint32_t byte = ops.ld_byte(row + elem * dim_stride * EB + (byte_col + b) % EB);
    w[b / 4] |= byte << (8 * (b % 4));
  }
  return typename Ops::U4{w[0], w[1], w[2], w[3]};
}

// The K/V blocks of `tile` (its chunk's, when its request is split): one function for the
// producer and the consumers, the same the planner ordered the tiles by.
template <int BN>
KVATTN_HD sched::KvRange tile_range(const PrefillParams& p, const sched::Tile& tile,
                                    const RequestInfo& r) {
  return sched::tile_kv_range(tile, r.qo_len, r.kv_len, p.causal, p.window_left, BN,
                              p.rows_per_token, r.chunks, p.chunk_blocks);
}

// Where byte `byte_col` of row `row` of a K (or 16-bit V) tile goes.
template <class Tag, int BN>
KVATTN_HD uint32_t kv_tile_offset(int row, int byte_col) {
  return Elem<Tag>::kFp8 ? smem::tile_offset8(row, byte_col, BN)
                         : smem::tile_offset(row, byte_col / 2, BN);
}

// Block n of K (or 16-bit V) [BN keys x kRowChunks 16-byte chunks] into its swizzled tile, zeros
// past kv_len: cp.async for rows in 16-byte chunks, else gathered (gather16) and stored by the
// thread. The producer runs at 40 registers, and ptxas (sm_90a) spills differently by type: the
// gather inside the cp.async loop (then unrolled by 2) spilled 136 bytes in the 16-bit kernels, a
// loop of its own 20 bytes in the FP8 ones; so 16-bit takes two loops, FP8 one with a branch.
template <class Tag, int BN, int kRowChunks, class Ops>
KVATTN_HD void copy_block(const Ops& ops, const PrefillParams& p, const RequestInfo& r,
                          const void* base, const paged::CacheStrides& s, bool chunks, int n,
                          int kv_head, uint8_t* tile, int tid) {
  constexpr int EB = Elem<Tag>::kBytes;
  constexpr bool kOneLoop = Elem<Tag>::kFp8;
  if (chunks || kOneLoop) {
    for_each_chunk<EB, BN, kRowChunks>(
        ops, p, r, base, s, n, kv_head, tid,
        [&](int row, int byte_col, const uint8_t* src, bool in) {
          uint8_t* dst = tile + kv_tile_offset<Tag, BN>(row, byte_col);
          if (!kOneLoop || chunks) {
            ops.cp_async_16_zfill(dst, src + byte_col, in, L2Hint::kEvictLast);
          } else {
            typename Ops::U4 vals{0, 0, 0, 0};
            if (in) vals = gather16<EB>(ops, src, byte_col, s.dim);
            ops.st_shared(reinterpret_cast<typename Ops::U4*>(dst), vals);
          }
        });
    return;
  }
  for_each_chunk<EB, BN, kRowChunks>(
      ops, p, r, base, s, n, kv_head, tid, [&](int row, int byte_col, const uint8_t* src, bool in) {
        typename Ops::U4 vals{0, 0, 0, 0};
        if (in) vals = gather16<EB>(ops, src, byte_col, s.dim);
        ops.st_shared(
            reinterpret_cast<typename Ops::U4*>(tile + kv_tile_offset<Tag, BN>(row, byte_col)),
            vals);
      });
}

// One store of copy_v_transposed: a word, or one byte of it.
template <class Ops>
KVATTN_HD void store_v_word(const Ops& ops, uint8_t* dst, uint32_t x) {
  ops.st_shared(reinterpret_cast<uint32_t*>(dst), x);
}
template <class Ops>
KVATTN_HD void store_v_word(const Ops& ops, uint8_t* dst, int b, uint8_t x) {
  ops.st_shared(dst + b, x);
}

// FP8 block n of V [BN keys x VO dims] into V^T [VO dims x BN keys] (v_transpose.h: the layout,
// why its stores are conflict-free), zeros past kv_len. Rows are located once per block as K's
// are (locate_lane_row); a unit's four key rows come from the lanes that located them by shuffles.
// 8-byte loads (or bytes for rows not in 16-byte chunks) into registers, prmt, 32-bit stores. Not
// unrolled (the producer's 40 registers; for_each_chunk).
template <int BN, int VO, class Ops>
KVATTN_HD void copy_v_transposed(const Ops& ops, const PrefillParams& p, const RequestInfo& r,
                                 int n, int kv_head, uint8_t* vt, int tid) {
  constexpr int kUnits = vt::kWarpQuads<BN> * VO / 8;
  static_assert(kUnits % 32 == 0, "every lane takes the same steps (shuffles)");
  const int warp = tid / 32, lane = tid % 32;
  const uintptr_t located = reinterpret_cast<uintptr_t>(
      locate_lane_row<1, BN>(ops, p, r, p.v, p.v_strides, n, kv_head, tid));
  // body(unit, store, key_row) for each unit of this lane: store(j, word) its store j (or
  // store(j, b, byte): byte b of it), key_row(b) the row of its quad's key b (from the lane that
  // located it).
  const auto for_each_unit = [&](auto&& body) {
    KVATTN_FA3_PRAGMA(unroll 1)
    for (unsigned u = unsigned(lane); u < unsigned(kUnits); u += 32) {
      const vt::Unit unit = vt::unit<BN>(u);
      const uint32_t offset0 = vt::store0_offset<BN, VO>(unit, vt::quad_word<BN>(warp, unit.quad));
      body(
          unit,
          [&](int j, auto... byte_and_x) {  // (j, word) or (j, byte b, its value)
            store_v_word(ops, vt + vt::store_offset(offset0, j), byte_and_x...);
          },
          [&](int b) {
            const int from = vt::key_lane(unit.quad, b);
            const uint64_t lo = ops.shfl_u32(uint32_t(located), from);
            const uint64_t hi = ops.shfl_u32(uint32_t(uint64_t(located) >> 32), from);
            return reinterpret_cast<const uint8_t*>(uintptr_t(lo | hi << 32));
          });
    }
  };
  if (!p.v_chunks) {
    // Rows not in 16-byte chunks (params.h): gathered byte by byte and stored so, key by key,
    // into the bytes of the words the others store whole (the same banks). Gathering a word (the
    // four rows' addresses held) spilled at the producer's 40 registers, as did this loop
    // unrolled (ptxas sm_90a, e4m3 d128: 36 and 80 bytes of spill stores).
    for_each_unit([&](const vt::Unit& unit, auto&& store, auto&& key_row) {
      KVATTN_FA3_PRAGMA(unroll 1)
      for (int b = 0; b < 4; ++b) {
        const uint8_t* src = key_row(b);
        KVATTN_FA3_PRAGMA(unroll 1)
        for (int j = 0; j < 8; ++j) {
          const int64_t dim = vt::store_dim<BN>(unit.piece, j);
          store(j, b, src != nullptr ? ops.ld_byte(src + dim * p.v_strides.dim) : uint8_t(0));
        }
      }
    });
    return;
  }
  for_each_unit([&](const vt::Unit& unit, auto&& store, auto&& key_row) {
    uint32_t k[4][2];  // key b's piece: dims 0-3, 4-7
    KVATTN_FA3_PRAGMA(unroll)
    for (int b = 0; b < 4; ++b) {
      const uint8_t* src = key_row(b);
      typename Ops::U2 x{0, 0};
      if (src != nullptr) x = ops.ld8(src + 8 * unit.piece, L2Hint::kEvictLast);
      k[b][0] = x.x;
      k[b][1] = x.y;
    }
    const int order = vt::dim_order<BN>(unit.piece);
    const vt::Selectors sel = vt::selectors(order);
    // The order's bit 2 exchanges the piece's two words (see v_transpose.h).
    const bool swap = (order & 4) != 0;
    KVATTN_FA3_PRAGMA(unroll)
    for (int g = 0; g < 2; ++g) {
      const auto word = [&](int b) { return swap ? k[b][1 - g] : k[b][g]; };
      uint32_t out[4];
      vt::transpose4(word(0), word(1), word(2), word(3), sel, out);
      KVATTN_FA3_PRAGMA(unroll)
      for (int e = 0; e < 4; ++e) store(4 * g + e, out[e]);
    }
  });
}

// FP8 block n of V, staged by TMA ([BN keys x VO dims] in 128-byte panels, tile_offset8), into
// V^T [VO dims x BN keys]: copy_v_transposed's units, prmt and conflict-free 32-bit stores, with
// the four keys' 8-byte pieces read from the staged tile (ld.shared.v2) instead of global memory,
// and zeros for keys at or past kv_len (`keys`: the block's keys below kv_len), as there (the
// consumers' guard for non-finite V in masked blocks would serve too; zeros keep V^T as it was).
// A lane of the second half of a 32-key group (vt::load_half) reads its quad's keys in the order
// 1, 0, 3, 2, which the prmt selectors undo (vt::staged_selectors): the 8 lanes of a quarter-warp
// phase then read 8 rows of 8 distinct residues mod 8, 8 distinct 16-byte chunks after the
// swizzle (one wavefront), where the order 0..3 put two rows on each chunk.
template <int BN, int VO, class Ops>
KVATTN_HD void stage_v_transposed(const Ops& ops, const uint8_t* staged, uint8_t* vt_tile,
                                  int64_t keys, int tid) {
  constexpr int kUnits = vt::kWarpQuads<BN> * VO / 8;
  const int warp = tid / 32, lane = tid % 32;
  // The warp's rows below kv_len, in 32 bits (a 64-bit compare per load spilled at the
  // producer's 40 registers: ptxas sm_90a, e4m3 d256, 32 bytes).
  const int valid = int(keys < int64_t(BN) ? keys : int64_t(BN)) - warp * kWarpRows<BN>;
  KVATTN_FA3_PRAGMA(unroll 1)
  for (unsigned u = unsigned(lane); u < unsigned(kUnits); u += 32) {
    const vt::Unit unit = vt::unit<BN>(u);
    const int half = vt::load_half(unit.quad);
    uint32_t x[4][2];  // load j: key j ^ half's piece (dims 0-3, 4-7)
    KVATTN_FA3_PRAGMA(unroll)
    for (int j = 0; j < 4; ++j) {
      // Every lane loads (a staged row past kv_len is in the tile, whatever it holds: another
      // request's keys, or TMA's zeros past the tensor), and a key past kv_len becomes zeros.
      const int key = vt::key_lane(unit.quad, j ^ half);  // the row in the warp's rows
      const typename Ops::U2 w = ops.ld_shared(reinterpret_cast<const typename Ops::U2*>(
          staged + smem::tile_offset8(warp * kWarpRows<BN> + key, 8 * unit.piece, BN)));
      x[j][0] = key < valid ? w.x : 0u;
      x[j][1] = key < valid ? w.y : 0u;
    }
    const int order = vt::dim_order<BN>(unit.piece);
    const vt::Selectors sel = vt::staged_selectors(order, half);
    const bool swap = (order & 4) != 0;  // as copy_v_transposed
    const uint32_t offset0 = vt::store0_offset<BN, VO>(unit, vt::quad_word<BN>(warp, unit.quad));
    KVATTN_FA3_PRAGMA(unroll)
    for (int g = 0; g < 2; ++g) {
      const auto word = [&](int j) { return swap ? x[j][1 - g] : x[j][g]; };
      uint32_t out[4];
      vt::transpose4(word(0), word(1), word(2), word(3), sel, out);
      KVATTN_FA3_PRAGMA(unroll)
      for (int e = 0; e < 4; ++e) {
        store_v_word(ops, vt_tile + vt::store_offset(offset0, 4 * g + e), out[e]);
      }
    }
  }
}

}  // namespace kvattn::fa3
