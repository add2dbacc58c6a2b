// fa3's attention kernel body (prefill and decode), written once for the GPU and the CPU: a
// host/device template over the thread-level operations of one SM90 CTA (Ops: device_ops.cuh's
// DeviceOps, the PTX of sm90_ptx.cuh, on the GPU; tests/cuda/fa3/fa3_emu_ops.h's binding to the SM90
// CTA emulator, tests/cuda/emulator/sm90_emulator.h, on the CPU, where tests/cuda/fa3/fa3_replay_test.cc runs
// this exact code against the fp64 reference). What the body does: prefill.cuh's header.
//
// An Ops is a per-thread handle with:
//   thread(), cta(), ctas()                       threadIdx.x, blockIdx.x, gridDim.x
//   template <int N> using Acc                    wgmma accumulators (float[N] on the GPU)
//   using AFrag                                   a register A fragment (uint32_t[4])
//   using U4, U2                                  16 / 8 bytes in registers (uint4, uint2)
//   smem_addr, ld16 / ld8 / ld_byte (global), st_shared, st_global, mbarrier_*,
//   fence_barrier_init, tma_load_4d, cp_async_16_zfill, cp_async_mbarrier_arrive_noinc,
//   fence_proxy_async, named_barrier_sync, sync_threads, setmaxnreg_inc/dec<N>, shfl_xor, shfl,
//   shfl_u32, syncwarp,
//   wgmma_fence/commit/wait<N>, wgmma_ss<Tag, N>, wgmma_rs<Tag, N>, fence_registers, pack16<Tag>,
//   pack_e4m3x4 (as in sm90_ptx.cuh), fast_div (cuda/common/fast_div.h's division)
#pragma once

#include <cmath>
#include <cstdint>

#include "core/attention_math.h"
#include "core/hd.h"
#include "cuda/fa3/kernels/consumer_pingpong.h"
#include "cuda/fa3/kernels/consumer_steps.h"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/epilogue.h"
#include "cuda/fa3/kernels/l2_hint.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/pipeline_state.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/tile_size.h"
#include "cuda/fa3/kernels/v_transpose.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

// The K and V rings' depth (tile_size.h: the same for every key).
inline constexpr int kStages = tile_shape(128, 128, 2).stages;
inline constexpr int kThreads = 3 * frag::kWarpgroupThreads;
inline constexpr int kWarpsPerWarpgroup = frag::kWarpgroupThreads / 32;
// Register split between the producer and the consumers (setmaxnreg): 128 x 40 + 256 x 232 fits
// the 64 K registers of an SM with one CTA resident. (The producer's copy loops are not unrolled:
// more spills at 40 otherwise; for_each_chunk.)
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;
// The registers per thread at launch (__launch_bounds__(kThreads, 1): ptxas gives 168).
inline constexpr int kLaunchRegs = 168;

// Rows are whole 128-byte panels (smem::padded_row_bytes): FP8 Q/K rows at head dims 64 and 192,
// and FP8 V^T rows of 64 keys (head dim 256), carry padding.
template <int EB, int QK, int VO>
struct SmemPlan {
  static constexpr TileShape kShape = tile_shape(QK, VO, EB);
  static_assert(kShape.stages == kStages && kShape.block_m == sched::kBlockM);
  static constexpr int BN = kShape.block_n;
  static constexpr uint32_t kQBytes =  // per warpgroup
      frag::kWarpgroupRows * smem::padded_row_bytes(QK * EB);
  static constexpr uint32_t kKBytes = BN * smem::padded_row_bytes(QK * EB);
  // 16-bit V [keys][dims]; FP8 V^T [dims][keys].
  static constexpr uint32_t kVBytes =
      EB == 2 ? BN * smem::padded_row_bytes(VO * EB) : VO * smem::padded_row_bytes(BN);
  // FP8 V by TMA: the block as it lies in memory, [keys][dims] in 128-byte panels as K's tile
  // (the TMA boxes'), staged for the producer's transpose into V^T (stage_v_transposed).
  static constexpr uint32_t kVStageBytes = EB == 1 ? BN * smem::padded_row_bytes(VO) : 0;
  static constexpr uint32_t q(int wg) { return uint32_t(wg) * kQBytes; }
  static constexpr uint32_t k(int stage) {
    return 2 * kQBytes + uint32_t(stage) * (kKBytes + kVBytes);
  }
  static constexpr uint32_t v(int stage) { return k(stage) + kKBytes; }
  static constexpr uint32_t v_stage(int stage) {
    return k(kStages) + uint32_t(stage) * kVStageBytes;
  }
  static constexpr uint32_t barriers() { return v_stage(kStages); }
  // + 1024: the dynamic shared memory base is rounded up to the swizzle's alignment.
  // full_q, empty_q: one per consumer warpgroup; full_k, full_v, empty_k, empty_v (and FP8's
  // full_vs, empty_vs): kStages mbarriers each (Barriers).
  static constexpr uint32_t total() {
    return barriers() + (4 + (EB == 1 ? 6 : 4) * kStages) * 8 + 1024;
  }
  static_assert(total() <= 227 * 1024, "a CTA's shared memory on SM90");
};

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

// The rings' mbarriers (pipeline_state.h): a K ring and a V ring of kStages slots, each slot with
// its `full` (the load landed) and `empty` (every consumer warp is done reading it).
// One base pointer (the producer runs at 40 registers): the arrays follow each other.
// Each consumer warpgroup's Q tile has its pair too, a ring of one slot: full_q (the Q warp's
// copies of the tile's rows landed) and empty_q (every warp of the warpgroup is done with the
// tile: its wgmmas read Q, its epilogue staged O there).
// FP8 V by TMA adds the staging ring's (SmemPlan::v_stage): full_vs (its box landed) and empty_vs
// (every producer thread has read it into registers), the producer's own.
struct Barriers {
  uint64_t* base;
  KVATTN_HD uint64_t* full_q(int wg) const { return base + wg; }
  KVATTN_HD uint64_t* empty_q(int wg) const { return base + 2 + wg; }
  KVATTN_HD uint64_t* full_k(int slot) const { return base + 4 + slot; }
  KVATTN_HD uint64_t* full_v(int slot) const { return base + 4 + kStages + slot; }
  KVATTN_HD uint64_t* empty_k(int slot) const { return base + 4 + 2 * kStages + slot; }
  KVATTN_HD uint64_t* empty_v(int slot) const { return base + 4 + 3 * kStages + slot; }
  KVATTN_HD uint64_t* full_vs(int slot) const { return base + 4 + 4 * kStages + slot; }
  KVATTN_HD uint64_t* empty_vs(int slot) const { return base + 4 + 5 * kStages + slot; }
};

// The producer warp that copies every tile's Q (produce_q): the last. On the 16-bit TMA path one
// thread of warp 0 issues every K/V box and the other warps have nothing else to do: there the Q
// warp walks the tiles on its own, and its empty_q waits hold up no K/V load. On the cp.async
// paths and FP8 by TMA all four warps copy K/V rows or transpose V (for_each_chunk's rows per
// warp, stage_v_transposed's units: a K/V block split over three warps would not give each lane
// one row), so no warp is free, and this one copies Q in its walk of the loads:
// - 16-bit cp.async at 128-key blocks, and FP8 by TMA: after the loads (FP8: the V transposes) of
//   the tile's first kStages blocks, the last that wait only for earlier tiles' releases; every
//   later one waits for S_0 of both consumer warpgroups, which needs this tile's Q, so the
//   empty_q waits hold back no load that could be in flight (fa3_pipeline_test.cc's
//   QPairAcrossTiles: the lookahead across tiles kept);
// - FP8 by cp.async and 16-bit (256, 256) by cp.async: before the tile's loads. There the warp's
//   share of the tile's first blocks waits for the previous tile's epilogues: the K/V lookahead
//   across tiles is lost on those paths (QPairAcrossTiles shows it). The later place spilled at
//   the producer's 40 registers (produce's kQAfterFirstBlocks).
inline constexpr int kQWarp = kWarpsPerWarpgroup - 1;

// Rows of consumer warpgroup wg's half of `tile` [64 rows x QK] into its swizzled Q tile (zeros
// past the request's packed rows), by the 32 lanes of the Q warp: cp.async of 16-byte chunks
// (evict_first: each Q row is read once) where the rows are runs of them (p.q_chunks), else
// gathered (gather16) and stored by the lane. Lane l takes rows l and 32 + l, each located once
// (the packed row's token and head: a 32-bit division), chunk by chunk.
template <class Tag, int QK, class Ops>
KVATTN_HD void copy_q(const Ops& ops, const PrefillParams& p, const sched::Tile& tile,
                      const RequestInfo& r, int wg, uint8_t* q_tile, int lane) {
  constexpr int EB = Elem<Tag>::kBytes;
  constexpr int kRowChunks = QK * EB / 16;
  // (32 bits: a request's packed rows are at most pack::kMaxPackedRows.)
  const int rows = int(pack::packed_rows(r.qo_len, p.rows_per_token));
  KVATTN_FA3_PRAGMA(unroll 1)
  for (int tile_row = lane; tile_row < frag::kWarpgroupRows; tile_row += 32) {
    const int row = tile.q_tile * sched::kBlockM + wg * frag::kWarpgroupRows + tile_row;
    const bool in = row < rows;
    const uint8_t* src = static_cast<const uint8_t*>(p.q);
    if (in) {
      const pack::TokenHead th = pack::token_head(row, tile.head, p.rows_per_token);
      src += ((r.q_row + th.token) * p.q_stride_row + th.qo_head * p.q_stride_head) * EB;
    }
    KVATTN_FA3_PRAGMA(unroll 1)
    for (int byte_col = 0; byte_col < kRowChunks * 16; byte_col += 16) {
      uint8_t* dst = q_tile + (Elem<Tag>::kFp8
                                   ? smem::tile_offset8(tile_row, byte_col, frag::kWarpgroupRows)
                                   : smem::tile_offset(tile_row, byte_col / 2,
                                                       frag::kWarpgroupRows));
      if (p.q_chunks) {
        ops.cp_async_16_zfill(dst, in ? src + byte_col : src, in, L2Hint::kEvictFirst);
      } else {
        typename Ops::U4 vals{0, 0, 0, 0};
        if (in) vals = gather16<EB>(ops, src, byte_col, p.q_stride_dim);
        ops.st_shared(reinterpret_cast<typename Ops::U4*>(dst), vals);
      }
    }
  }
}

// Tile t's number in the CTA's walk of the tile list (its uses of the Q pair so far), found from
// t rather than counted: a count held across the loops spilled, in the producer at 40 registers
// and in the consumers at head dim 256 (ptxas sm_90a).
template <class Ops>
KVATTN_HD int q_use(const Ops& ops, int t) {
  // (The CTA's tiles are first_tile + k ctas, first_tile < ctas: tile_scheduler.h.)
  return int(uint32_t(t) / uint32_t(ops.ctas()));
}

// The Q warp's share of tile t of the CTA's tiles: for each computing
// consumer warpgroup (a one-warpgroup launch has only the first: the second has exited), once the
// warpgroup released its Q tile (empty_q: its previous tile's epilogue is done), its rows, then
// full_q: the cp.async copies' arrivals when they complete (noinc: this lane's of the 32 the
// barrier counts), or, for gathered rows, the lane's proxy fence (the consumers' wgmma reads Q)
// and a plain arrival, as produce's K/V copies. Warpgroup 0 first: the ping-pong puts its epilogue
// first.
template <class Tag, int QK, int VO, class Ops>
KVATTN_HD void produce_q(const Ops& ops, const PrefillParams& p, uint8_t* smem, const Barriers& b,
                         int t, int lane) {
  using Plan = SmemPlan<Elem<Tag>::kBytes, QK, VO>;
  KVATTN_FA3_PRAGMA(unroll)
  for (int wg = 0; wg < 2; ++wg) {
    if (wg == p.consumer_warpgroups) break;
    ops.mbarrier_wait(b.empty_q(wg), pipe::q_producer_parity(q_use(ops, t)));
    // The tile and its request read after the wait (its memory clobber keeps them loads), so that
    // they hold no registers across it.
    const sched::Tile tile = p.tiles[t];
    copy_q<Tag, QK>(ops, p, tile, p.requests[tile.request], wg, smem + Plan::q(wg), lane);
    if (p.q_chunks) {
      ops.cp_async_mbarrier_arrive_noinc(b.full_q(wg));
    } else {
      ops.fence_proxy_async();
      ops.mbarrier_arrive(b.full_q(wg));
    }
  }
}

// A K or V block by TMA (one thread): the slot's expected bytes, then one box per 128-byte panel
// of the tile (kernel_params.cc's kv_map_spec: 64 16-bit or 128 FP8 columns x 1 head x BN keys),
// each landing in the panel's place of the swizzled tile (smem_layout.h's tma_panel_offset), as
// the wgmma descriptors read it. `at`: the block's first row in the map (box_origin).
template <int EB, int BN, class Ops>
KVATTN_HD void tma_load_block(const Ops& ops, const CUtensorMap* map, uint8_t* dst, uint64_t* full,
                              uint32_t bytes, int panels, BoxOrigin at, int kv_head) {
  ops.mbarrier_arrive_expect_tx(full, bytes);
  for (int panel = 0; panel < panels; ++panel) {
    ops.tma_load_4d(dst + smem::tma_panel_offset(panel, BN), map, panel * (smem::kRowBytes / EB),
                    kv_head, at.slot, at.page, full, L2Hint::kEvictLast);
  }
}

// The FP8 producer over K/V that TMA can read (dense, ragged, and pages of a multiple of the
// block: kernel_params.cc), FA3's way:
// thread 0 issues every box (K(n) into the K ring; V(n + 1) into the staging ring, a block ahead
// of its transpose), and the 128 threads transpose the staged V(n) into the V ring
// (stage_v_transposed) once its box landed (full_vs) and the consumers released the slot
// (empty_v), then release the staging slot (empty_vs: one arrival each, the values being in
// registers) and arrive on full_v (their proxy fence first: the consumers' wgmma reads V^T).
// Blocks go K(n), V(n) as the cp.async path's (the FP8 consumers take one block at a time).
// Thread 0 waits for a free staging slot after its own transpose of the block before: the other
// threads' transposes of it depend on no load of thread 0's, so the wait ends. The Q warp copies
// the tile's Q after its transposes of the tile's first kStages blocks (kQWarp).
template <class Tag, int QK, int VO, class Ops>
KVATTN_HD void produce_fp8_by_tma(const Ops& ops, const PrefillParams& p, uint8_t* smem,
                                  const Barriers& b) {
  using Plan = SmemPlan<1, QK, VO>;
  constexpr int BN = Plan::BN;
  constexpr int kKPanels = int(smem::padded_row_bytes(QK)) / smem::kRowBytes;
  constexpr int kVPanels = int(smem::padded_row_bytes(VO)) / smem::kRowBytes;
  const int tid = ops.thread();
  const bool q_warp = tid / 32 == kQWarp;
  const pipe::PipelineState<kStages> start = pipe::producer_start<kStages>();
  int used = 0;  // blocks of this CTA's earlier tiles: uses of each ring so far
  for (int t = sched::first_tile(ops.cta()); t < p.num_tiles; t = sched::next_tile(t, ops.ctas())) {
    // The tile's blocks from `from` on, up to the Q warp's copies (to_q: after the first kStages
    // blocks) or to the end, which it returns. The tile is read at each call (the waits' memory
    // clobbers keep it loads), so that none of it is held across the copies: copying Q inside one
    // loop over the blocks spilled (ptxas sm_90a, e4m3 d128: 68 bytes of spill stores).
    const auto walk = [&](int from, bool to_q) {
      const sched::Tile tile = p.tiles[t];
      const RequestInfo r = p.requests[tile.request];
      const sched::KvRange kr = tile_range<BN>(p, tile, r);
      const int kv_head = pack::kv_head(tile.head, p.rows_per_token, p.group);
      const int blocks = kr.end > kr.begin ? kr.end - kr.begin : 0;
      // Thread 0: block `block`'s K or V box into its ring's slot once the slot is free. The
      // request read again (the wait's memory clobber keeps it a load), as the cp.async path does.
      const auto issue = [&](bool v, int block) {
        const pipe::PipelineState<kStages> st = pipe::state_at(start, used + block);
        ops.mbarrier_wait(v ? b.empty_vs(st.index) : b.empty_k(st.index), st.phase);
        const RequestInfo req = p.requests[p.tiles[t].request];
        const BoxOrigin at = box_origin<BN>(ops, p, req, kr.begin + block);
        if (v) {
          tma_load_block<1, BN>(ops, &p.tma_v, smem + Plan::v_stage(st.index), b.full_vs(st.index),
                                Plan::kVStageBytes, kVPanels, at, kv_head);
        } else {
          tma_load_block<1, BN>(ops, &p.tma_k, smem + Plan::k(st.index), b.full_k(st.index),
                                Plan::kKBytes, kKPanels, at, kv_head);
        }
      };
      const int end = to_q && blocks > kStages ? kStages : blocks;
      if (tid == 0 && from == 0 && blocks > 0) issue(true, 0);
      for (int i = from; i < end; ++i) {
        if (tid == 0) {
          issue(false, i);
          if (i + 1 < blocks) issue(true, i + 1);
        }
        const pipe::PipelineState<kStages> st = pipe::state_at(start, used + i);
        ops.mbarrier_wait(b.full_vs(st.index), st.phase ^ 1u);  // the consumers' parity
        ops.mbarrier_wait(b.empty_v(st.index), st.phase);
        const RequestInfo req = p.requests[p.tiles[t].request];
        stage_v_transposed<BN, VO>(ops, smem + Plan::v_stage(st.index), smem + Plan::v(st.index),
                                   req.kv_len - int64_t(kr.begin + i) * BN, tid);
        ops.mbarrier_arrive(b.empty_vs(st.index));
        ops.fence_proxy_async();
        ops.mbarrier_arrive(b.full_v(st.index));
      }
      return end;
    };
    const int q_block = walk(0, true);
    if (q_warp) produce_q<Tag, QK, VO>(ops, p, smem, b, t, tid % 32);
    used += walk(q_block, false);
  }
}

// One K or V load of the cp.async paths (produce): block `block` of tile t (its first block
// kv_begin), use `use` of its ring: wait for the slot's release, copy, then the slot's `full`
// arrival.
template <class Tag, int QK, int VO, class Ops>
KVATTN_HD void load_kv(const Ops& ops, const PrefillParams& p, uint8_t* smem, const Barriers& b,
                       int t, int kv_begin, int use, bool v, int block, int tid) {
  constexpr int EB = Elem<Tag>::kBytes;
  using Plan = SmemPlan<EB, QK, VO>;
  constexpr int BN = Plan::BN;
  constexpr int kKRowChunks = QK * EB / 16;  // 16-byte chunks per K row
  constexpr int kVRowChunks = VO * EB / 16;
  const int n = kv_begin + block;
  const pipe::PipelineState<kStages> st = pipe::state_at(pipe::producer_start<kStages>(), use);
  ops.mbarrier_wait(v ? b.empty_v(st.index) : b.empty_k(st.index), st.phase);
  // The tile and its request read again (the wait's memory clobber keeps them loads), so that
  // their fields and the KV head hold no registers across the copy: without the request's the
  // producer spilled at 40 (ptxas sm_90a: 56 bytes of spill stores in bf16 d128, 48 in e4m3
  // d128); the KV head held across the FP8 loop cost 8 bytes more with the Q warp's copies.
  const sched::Tile tl = p.tiles[t];
  const RequestInfo req = p.requests[tl.request];
  const int kv_head = pack::kv_head(tl.head, p.rows_per_token, p.group);
  if (!v) {
    copy_block<Tag, BN, kKRowChunks>(ops, p, req, p.k, p.k_strides, p.k_chunks, n, kv_head,
                                     smem + Plan::k(st.index), tid);
  } else if constexpr (!Elem<Tag>::kFp8) {
    copy_block<Tag, BN, kVRowChunks>(ops, p, req, p.v, p.v_strides, p.v_chunks, n, kv_head,
                                     smem + Plan::v(st.index), tid);
  } else {
    copy_v_transposed<BN, VO>(ops, p, req, n, kv_head, smem + Plan::v(st.index), tid);
  }
  // The slot's `full` arrival. Rows copied by cp.async arrive on the barrier when the copies
  // complete (noinc: that is this thread's arrival of the 128 the barrier counts), so the
  // producer goes on to the next slot without waiting for them, and the consumers fence
  // them for wgmma after their wait. Rows this thread stored (rows not in 16-byte chunks,
  // gathered; FP8 V^T, whose rows go through registers to be transposed, with no cp.async)
  // take its proxy fence and a plain arrival, whose release orders the stores (the
  // asynchronous arrive-on of cp.async.mbarrier.arrive is not documented to).
  uint64_t* full = v ? b.full_v(st.index) : b.full_k(st.index);
  if (!(Elem<Tag>::kFp8 && v) && (v ? p.v_chunks : p.k_chunks)) {
    ops.cp_async_mbarrier_arrive_noinc(full);
  } else {
    ops.fence_proxy_async();
    ops.mbarrier_arrive(full);
  }
}

// Warpgroup 0: the K and V blocks of every tile of this CTA into their rings, in the consumers'
// order (pipe::kv_load: 16-bit K(n+1) before V(n)), and every tile's Q by its Q warp (kQWarp,
// produce_q).
template <class Tag, int QK, int VO, class Ops>
KVATTN_HD void produce(const Ops& ops, const PrefillParams& p, uint8_t* smem, const Barriers& b) {
  constexpr int EB = Elem<Tag>::kBytes;
  constexpr bool kKAhead = !Elem<Tag>::kFp8;
  using Plan = SmemPlan<EB, QK, VO>;
  constexpr int BN = Plan::BN;
  const int tid = ops.thread();  // 0..127
  const pipe::PipelineState<kStages> start = pipe::producer_start<kStages>();
  int used = 0;  // blocks of this CTA's earlier tiles: uses of each ring so far
  // The TMA boxes of a K and of a 16-bit V block: its rows' 128-byte panels.
  constexpr int kKPanels = int(smem::padded_row_bytes(QK * EB)) / smem::kRowBytes;
  constexpr int kVPanels = int(smem::padded_row_bytes(VO * EB)) / smem::kRowBytes;
  const bool q_warp = tid / 32 == kQWarp;
  if (!Elem<Tag>::kFp8 && p.tma) {
    // One thread issues every load: the expected bytes, then the panels of K or of V; the Q warp
    // copies every tile's Q on its own, so its empty_q waits hold up no K/V load.
    if (q_warp) {
      for (int t = sched::first_tile(ops.cta()); t < p.num_tiles;
           t = sched::next_tile(t, ops.ctas())) {
        produce_q<Tag, QK, VO>(ops, p, smem, b, t, tid % 32);
      }
      return;
    }
    if (tid != 0) return;
    for (int t = sched::first_tile(ops.cta()); t < p.num_tiles;
         t = sched::next_tile(t, ops.ctas())) {
      const sched::Tile tile = p.tiles[t];
      const RequestInfo r = p.requests[tile.request];
      const sched::KvRange kr = tile_range<BN>(p, tile, r);
      const int kv_head = pack::kv_head(tile.head, p.rows_per_token, p.group);
      const int blocks = kr.end > kr.begin ? kr.end - kr.begin : 0;
      for (int j = 0; j < 2 * blocks; ++j) {
        const pipe::KvLoad l = pipe::kv_load(j, blocks, kKAhead);
        const pipe::PipelineState<kStages> st = pipe::state_at(start, used + l.block);
        uint64_t* full = l.v ? b.full_v(st.index) : b.full_k(st.index);
        ops.mbarrier_wait(l.v ? b.empty_v(st.index) : b.empty_k(st.index), st.phase);
        tma_load_block<EB, BN>(ops, l.v ? &p.tma_v : &p.tma_k,
                               smem + (l.v ? Plan::v(st.index) : Plan::k(st.index)), full,
                               l.v ? Plan::kVBytes : Plan::kKBytes, l.v ? kVPanels : kKPanels,
                               box_origin<BN>(ops, p, r, kr.begin + l.block), kv_head);
      }
      used += blocks;
    }
    return;
  }
  if constexpr (Elem<Tag>::kFp8) {
    if (p.tma) {
      produce_fp8_by_tma<Tag, QK, VO>(ops, p, smem, b);
      return;
    }
  }
  // Where the Q warp copies a tile's Q in its walk of the loads (kQWarp): after the loads of the
  // tile's first kStages blocks where ptxas allows it (16-bit, 128-key blocks), else before the
  // tile's loads (FP8 and 16-bit (256, 256) by cp.async: the later place spilled, sm_90a: 48 bytes
  // of spill stores in e4m3 d128; 8 in the bf16 (256, 256) consumers).
  constexpr bool kQAfterFirstBlocks = kKAhead && BN == 128;
  for (int t = sched::first_tile(ops.cta()); t < p.num_tiles; t = sched::next_tile(t, ops.ctas())) {
    if constexpr (kQAfterFirstBlocks) {
      // The tile's loads in pipe::kv_load's order from load `from` on, up to the Q warp's copies
      // (to_q) or to the end, which it returns. The Q copies go after the loads of the tile's
      // first kStages blocks, which wait only for earlier tiles' releases: every later load
      // waits for this tile's S_0 of every consumer warpgroup, which needs its Q, so the
      // empty_q waits hold back no load that could be in flight (fa3_pipeline_test.cc's
      // QPairAcrossTiles). The tile is read at each call (the waits' memory clobbers keep it
      // loads): none of it is held across the copies.
      const auto walk = [&](int from, bool to_q) {
        const sched::Tile tile = p.tiles[t];
        const RequestInfo r = p.requests[tile.request];
        const sched::KvRange kr = tile_range<BN>(p, tile, r);
        const int blocks = kr.end > kr.begin ? kr.end - kr.begin : 0;
        const int end = to_q && blocks > kStages ? 2 * kStages - 1 : 2 * blocks;
        for (int j = from; j < end; ++j) {
          const pipe::KvLoad l = pipe::kv_load(j, blocks, kKAhead);
          load_kv<Tag, QK, VO>(ops, p, smem, b, t, kr.begin, used + l.block, l.v, l.block, tid);
        }
        return end;
      };
      const int q_at = walk(0, true);
      if (q_warp) produce_q<Tag, QK, VO>(ops, p, smem, b, t, tid % 32);
      used += walk(q_at, false) / 2;
    } else {
      if (q_warp) produce_q<Tag, QK, VO>(ops, p, smem, b, t, tid % 32);
      const sched::Tile tile = p.tiles[t];
      const RequestInfo r = p.requests[tile.request];
      const sched::KvRange kr = tile_range<BN>(p, tile, r);
      const int blocks = kr.end > kr.begin ? kr.end - kr.begin : 0;
      // pipe::kv_load's order; two loads a step, each with its ring known at compile time.
      if constexpr (kKAhead) {
        for (int j = 0; j < 2 * blocks; ++j) {
          const pipe::KvLoad l = pipe::kv_load(j, blocks, kKAhead);
          load_kv<Tag, QK, VO>(ops, p, smem, b, t, kr.begin, used + l.block, l.v, l.block, tid);
        }
      } else {
        for (int i = 0; i < blocks; ++i) {
          load_kv<Tag, QK, VO>(ops, p, smem, b, t, kr.begin, used + i, false, i, tid);
          load_kv<Tag, QK, VO>(ops, p, smem, b, t, kr.begin, used + i, true, i, tid);
        }
      }
      used += blocks;
    }
  }
}

template <class Tag, int QK, int VO, class Ops>
KVATTN_HD void consume(const Ops& ops, const PrefillParams& p, uint8_t* smem, const Barriers& b,
                       int wg) {
  constexpr int EB = Elem<Tag>::kBytes;
  constexpr bool kFp8 = Elem<Tag>::kFp8;
  using Plan = SmemPlan<EB, QK, VO>;
  constexpr int BN = Plan::BN;
  constexpr int kSRegs = BN / 2;  // S accumulators per thread (N = keys of a block)
  constexpr int kORegs = VO / 2;  // O accumulators per thread (N = the V head dim)
  const int ctid = ops.thread() % frag::kWarpgroupThreads;
  const int lane = ops.thread() % 32;
  uint8_t* q_smem = smem + Plan::q(wg);
  const uint32_t q_addr = ops.smem_addr(q_smem);
  // The K and V rings are used once per block each, in the same order: one state serves both.
  pipe::PipelineState<kStages> st = pipe::consumer_start<kStages>();
  const float exp_scale = step::exp_scale(p);  // into softmax's exp2 argument
  // The two consumer warpgroups' GEMMs take turns (consumer_pingpong.h): every wgmma below is
  // issued between begin_turn and end_turn, and every GEMM step takes its turn, even one whose
  // GEMM guarded_pv replaces (an empty turn), so both warpgroups take the same number of turns.
  const PingPong pp{wg, p.consumer_warpgroups == 2};
  pp.start(ops);

  for (int t = sched::first_tile(ops.cta()); t < p.num_tiles; t = sched::next_tile(t, ops.ctas())) {
    const sched::Tile tile = p.tiles[t];
    const RequestInfo r = p.requests[tile.request];
    const sched::KvRange kr = tile_range<BN>(p, tile, r);
    // Rows are packed rows (packed_rows.h): query tokens, or (token, head) of a GQA group.
    // (32 bits: a request's packed rows are at most pack::kMaxPackedRows.)
    const int row0 = tile.q_tile * sched::kBlockM + wg * frag::kWarpgroupRows;
    // The causal diagonal of this thread's two rows (one per accumulator row half) is
    // diag0 + token_step[h]: the token of the warpgroup's first row plus the (32-bit) token
    // offset of the row, both found once per tile (a division per masked block spills).
    const int64_t token0 = pack::token_of(row0, p.rows_per_token);
    const int64_t diag0 = token0 + r.kv_len - r.qo_len;
    int token_step[2];
    KVATTN_FA3_PRAGMA(unroll)
    for (int h = 0; h < 2; ++h) {
      token_step[h] =
          int(pack::token_of(row0 + frag::acc_element(ctid, 2 * h).row, p.rows_per_token) - token0);
    }

    // This warpgroup's Q rows, copied into its swizzled tile by the producer's Q warp
    // (produce_q) once the warpgroup released the tile after its previous tile's epilogue.
    // The two warpgroup barriers around the wait are not needed for the order (every thread
    // waits on full_q, and empty_q orders the epilogue before the copy): they are the old Q
    // load's, kept because without them ptxas spilled in bf16 (256, 256) (sm_90a: 132 bytes of
    // spill stores without either, 8 with the second alone).
    ops.named_barrier_sync(bar::warpgroup(wg), frag::kWarpgroupThreads);
    ops.mbarrier_wait(b.full_q(wg), pipe::q_consumer_parity(q_use(ops, t)));
    ops.fence_proxy_async();  // the Q warp's cp.async bytes, for wgmma (as K/V's)
    ops.named_barrier_sync(bar::warpgroup(wg), frag::kWarpgroupThreads);

    typename Ops::template Acc<kORegs> o;
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};

    // The K and V rings (pipeline_state.h): block n's K is waited for, read by S = Q K^T and
    // released as soon as S is done; its V is waited for and released around O += P V. A
    // release is one arrival per consumer warp, once the warp is past the wgmma that read the
    // slot. (The slot is advanced, not computed from a count: pipe::state_at here cost the FP8
    // consumers 24 bytes of spills, ptxas sm_90a.)
    const auto release = [&](uint64_t* empty) {
      ops.syncwarp();
      if (lane == 0) ops.mbarrier_arrive(empty);
    };
    // Softmax of block n overlapped with O += P V of block n - 1 (FA3's intra-warpgroup
    // overlap): S_n is issued before PV_{n-1}, waited for alone (wgmma groups complete in order:
    // then K(n) is released), and turned into P_n while PV_{n-1} runs; O is rescaled once
    // PV_{n-1} is done, and V(n - 1) is released then. A consumer thus holds one K and one V
    // slot, and the producer, loading K(n + 1) before V(n), keeps the next block's loads in
    // flight while the consumers compute (fa3_pipeline_test replays the order).
    // FP8 keeps the blocks apart (one at a time, as below the overlap): with S, P and O live at
    // once its consumers spill (ptxas: 64 bytes), and FP8's P is half the registers that would
    // pay for it. FP8's O stays in f32 registers: each block's P V goes into a fresh wgmma
    // accumulator (in S's registers, free by then) added to O by FFMA (pv_promoted: FP8 wgmma
    // adds in reduced precision).
    constexpr int kPSteps = BN * EB / 32;
    constexpr bool kOverlap = Plan::kShape.intra_wg_overlap;
    typename Ops::template Acc<kSRegs> s;
    typename Ops::AFrag a[kPSteps];
    if constexpr (!kOverlap) {
      for (int n = kr.begin; n < kr.end; ++n) {
        // V(n) is waited for with K(n) (the producer loads it right behind K(n): pipe::kv_load)
        // and checked for inf/NaN before S is issued, while S's registers are free.
        const pipe::PipelineState<kStages> cur = st;
        st.advance();
        ops.mbarrier_wait(b.full_k(cur.index), cur.phase);
        ops.mbarrier_wait(b.full_v(cur.index), cur.phase);
        ops.fence_proxy_async();  // the producer's cp.async bytes, for wgmma (produce)
        const bool guard = kr.masked(n) && step::v_has_non_finite<Tag, VO, BN>(
                                               ops, smem + Plan::v(cur.index), ctid, wg);
        pp.begin_turn(ops);
        step::issue_s<Tag, QK, EB, BN>(ops, s, q_addr, ops.smem_addr(smem + Plan::k(cur.index)));
        pp.end_turn(ops);
        ops.template wgmma_wait<0>();
        ops.fence_registers(s);
        release(b.empty_k(cur.index));
        step::scores<BN>(s, p, kr.masked(n), n, r.kv_len, diag0, token_step, ctid);
        float alpha[2];
        step::softmax<BN>(ops, s, exp_scale, m, l, alpha);
        if (guard) {
          pp.begin_turn(ops);  // an empty turn: O += P V without wgmma, outside the turn
          pp.end_turn(ops);
          step::rescale<kORegs>(o, alpha);
          step::guarded_pv<Tag, VO, BN, kPSteps>(ops, o, s, a, smem + Plan::v(cur.index), p, n,
                                                 r.kv_len, diag0, token_step, ctid);
        } else {
          step::pack_p<Tag, kFp8, BN, kPSteps>(ops, s, a);
          pp.begin_turn(ops);
          step::pv_promoted<Tag, VO, kPSteps>(ops, o, alpha, a,
                                              ops.smem_addr(smem + Plan::v(cur.index)),
                                              [&] { pp.end_turn(ops); });
        }
        release(b.empty_v(cur.index));
      }
    } else if (kr.begin < kr.end) {
      ops.mbarrier_wait(b.full_k(st.index), st.phase);
      ops.fence_proxy_async();  // the producer's cp.async bytes, for wgmma (produce)
      pp.begin_turn(ops);
      step::issue_s<Tag, QK, EB, BN>(ops, s, q_addr, ops.smem_addr(smem + Plan::k(st.index)));
      pp.end_turn(ops);
      ops.template wgmma_wait<0>();
      ops.fence_registers(s);
      release(b.empty_k(st.index));
      step::scores<BN>(s, p, kr.masked(kr.begin), kr.begin, r.kv_len, diag0, token_step, ctid);
      float alpha[2];
      step::softmax<BN>(ops, s, exp_scale, m, l, alpha);  // O is still zero: nothing to rescale
      step::pack_p<Tag, kFp8, BN, kPSteps>(ops, s, a);
      pipe::PipelineState<kStages> prev = st;  // block n - 1: its V is next
      st.advance();
      for (int n = kr.begin + 1; n < kr.end; ++n) {
        // V(n - 1), and whether its O += P V must be guarded_pv (consumer_steps.h); a guarded
        // block's runs here, before S_n is issued: S's registers are free then (P_{n-1} is in
        // the A fragments), and nothing is in flight.
        ops.mbarrier_wait(b.full_v(prev.index), prev.phase);
        const bool guard_prev = kr.masked(n - 1) && step::v_has_non_finite<Tag, VO, BN>(
                                                        ops, smem + Plan::v(prev.index), ctid, wg);
        if (guard_prev) {
          step::guarded_pv<Tag, VO, BN, kPSteps>(ops, o, s, a, smem + Plan::v(prev.index), p, n - 1,
                                                 r.kv_len, diag0, token_step, ctid);
        }
        ops.mbarrier_wait(b.full_k(st.index), st.phase);
        ops.fence_proxy_async();  // K(n)'s and V(n - 1)'s cp.async bytes, for wgmma
        // One turn for S_n and PV_{n-1} (FA3's order): the other warpgroup's softmax runs under
        // both.
        pp.begin_turn(ops);
        step::issue_s<Tag, QK, EB, BN>(ops, s, q_addr, ops.smem_addr(smem + Plan::k(st.index)));
        if (!guard_prev) {
          step::issue_pv<Tag, VO, BN, kPSteps>(ops, o, a,
                                               ops.smem_addr(smem + Plan::v(prev.index)));
        }
        pp.end_turn(ops);
        if (guard_prev) {
          ops.template wgmma_wait<0>();  // S_n done (no PV_{n-1} in flight)
        } else {
          ops.template wgmma_wait<1>();  // S_n done; PV_{n-1} may still run
        }
        ops.fence_registers(s);
        release(b.empty_k(st.index));
        step::scores<BN>(s, p, kr.masked(n), n, r.kv_len, diag0, token_step, ctid);
        step::softmax<BN>(ops, s, exp_scale, m, l, alpha);
        ops.template wgmma_wait<0>();  // PV_{n-1} done: V(n - 1), O and P are free
        step::pv_done<VO, kPSteps>(ops, o, a);
        release(b.empty_v(prev.index));
        step::rescale<kORegs>(o, alpha);
        step::pack_p<Tag, kFp8, BN, kPSteps>(ops, s, a);
        prev = st;
        st.advance();
      }
      ops.mbarrier_wait(b.full_v(prev.index), prev.phase);
      ops.fence_proxy_async();
      const bool guard_last =
          kr.masked(kr.end - 1) &&
          step::v_has_non_finite<Tag, VO, BN>(ops, smem + Plan::v(prev.index), ctid, wg);
      // The last P V's turn; empty when guarded. (Written as one turn around an if over both
      // forms, with guarded_pv after it, bf16 (256, 256) spilled 116 bytes: ptxas sm_90a.)
      pp.begin_turn(ops);
      if (guard_last) {
        pp.end_turn(ops);
        step::guarded_pv<Tag, VO, BN, kPSteps>(ops, o, s, a, smem + Plan::v(prev.index), p,
                                               kr.end - 1, r.kv_len, diag0, token_step, ctid);
      } else {
        step::issue_pv<Tag, VO, BN, kPSteps>(ops, o, a, ops.smem_addr(smem + Plan::v(prev.index)));
        pp.end_turn(ops);
      }
      ops.template wgmma_wait<0>();
      step::pv_done<VO, kPSteps>(ops, o, a);
      release(b.empty_v(prev.index));
    }
    // Epilogue: normalize, write O and the natural-log LSE of the rows this request has.
    KVATTN_FA3_PRAGMA(unroll)
    for (int h = 0; h < 2; ++h) {
      l[h] += ops.shfl_xor(l[h], 1);
      l[h] += ops.shfl_xor(l[h], 2);
    }
    // Where the rows go: out (and lse), or, for a split request, the partial state of (token,
    // chunk) (split_plan.h), merged by the split-KV merge (cuda/common/split_merge.h). The request
    // is read again here (the mbarrier waits' memory clobbers keep it a load) so that its split
    // fields hold no registers during the main loop.
    const RequestInfo re = p.requests[tile.request];
    const bool split = re.chunks > 1;
    const int64_t rows = pack::packed_rows(re.qo_len, p.rows_per_token);
    // The row's end (core/attention_math.h, fa2's and the cpu's too): o = 0 and lse = -inf
    // without a visible key, o = lse = NaN after a NaN score (the numerics policy; a split merge
    // then folds the NaN in instead of dropping the row). FP8's O carries P's 2^8 (pack_p).
    float inv[2];
    KVATTN_FA3_PRAGMA(unroll)
    for (int h = 0; h < 2; ++h) {
      const math::RowFinish fin = math::finish_row(m[h], l[h], p.v_scale);
      inv[h] = kFp8 ? fin.o_scale * step::kFp8PUnscale : fin.o_scale;
      const int64_t row = row0 + frag::acc_element(ctid, 2 * h).row;
      if (row >= rows || lane % 4 != 0) continue;
      const pack::TokenHead th = pack::token_head(row, tile.head, p.rows_per_token);
      if (split) {
        const int64_t state = re.partial_base + th.token * re.chunks + tile.chunk;
        p.partial_lse[state * p.num_qo_heads + th.qo_head] = fin.lse;
      } else if (p.lse) {
        p.lse[(re.q_row + th.token) * p.lse_stride_row + th.qo_head * p.lse_stride_head] =
            fin.lse * p.lse_scale;
      }
    }
    // O through the warpgroup's Q tile (epilogue.h), in the output's type: f32 partial states
    // [state, H_qo, VO] of (token, chunk) at partial_base + token * chunks + chunk, or out.
    constexpr int kQRowBytes = int(smem::padded_row_bytes(QK * EB));
    if (split) {
      const int64_t row_bytes = int64_t(VO) * 4;
      const epi::OutRows dst{reinterpret_cast<uint8_t*>(p.partial_o) +
                                 (re.partial_base + tile.chunk) * p.num_qo_heads * row_bytes,
                             re.chunks * p.num_qo_heads * row_bytes, row_bytes, 1, true};
      epi::store_o<epi::F32Out, VO, kQRowBytes>(ops, o, inv, q_smem, dst, row0, rows, tile.head,
                                                p.rows_per_token, ctid, wg);
    } else {
      const int64_t eb = p.out_kind == OutKind::kF32 ? 4 : 2;
      const epi::OutRows dst{static_cast<uint8_t*>(p.out) + re.q_row * p.o_stride_row * eb,
                             p.o_stride_row * eb, p.o_stride_head * eb, p.o_stride_dim, p.o_chunks};
      if (p.out_kind == OutKind::kF32) {
        epi::store_o<epi::F32Out, VO, kQRowBytes>(ops, o, inv, q_smem, dst, row0, rows, tile.head,
                                                  p.rows_per_token, ctid, wg);
      } else if (p.out_kind == OutKind::kF16) {
        epi::store_o<cuda::F16Tag, VO, kQRowBytes>(ops, o, inv, q_smem, dst, row0, rows, tile.head,
                                                   p.rows_per_token, ctid, wg);
      } else {
        epi::store_o<cuda::Bf16Tag, VO, kQRowBytes>(ops, o, inv, q_smem, dst, row0, rows, tile.head,
                                                    p.rows_per_token, ctid, wg);
      }
    }
    // The Q tile is free: this warp's wgmmas that read Q and its epilogue's reads of the staged O
    // are done. The Q warp may copy the next tile's rows (while the other warpgroup computes).
    release(b.empty_q(wg));
  }
}

// One CTA: the ring's barriers, the register split, then warpgroup 0 produces and 1 and 2
// consume. smem_raw: the dynamic shared memory (its base rounded up to 1024 bytes here).
template <class Tag, int QK, int VO, class Ops>
KVATTN_HD void prefill_cta(const Ops& ops, const PrefillParams& p, uint8_t* smem_raw) {
  uint8_t* smem = smem_raw + ((1024u - (ops.smem_addr(smem_raw) & 1023u)) & 1023u);
  using Plan = SmemPlan<Elem<Tag>::kBytes, QK, VO>;
  const Barriers b{reinterpret_cast<uint64_t*>(smem + Plan::barriers())};
  if (ops.thread() == 0) {
    for (int wg = 0; wg < 2; ++wg) {
      // full_q: the Q warp's 32 lanes (produce_q); empty_q: the consumer warpgroup's warps.
      ops.mbarrier_init(b.full_q(wg), 32);
      ops.mbarrier_init(b.empty_q(wg), kWarpsPerWarpgroup);
    }
    for (int s = 0; s < kStages; ++s) {
      // TMA: one arrival with the expected bytes; cp.async: every producer thread arrives (its
      // copies' cp.async.mbarrier.arrive.noinc, or a plain arrival for rows it stores itself:
      // produce). TMA loads K of every type and 16-bit V; FP8 V^T is stored by the threads.
      const int producer = frag::kWarpgroupThreads;
      ops.mbarrier_init(b.full_k(s), p.tma ? 1 : producer);
      ops.mbarrier_init(b.full_v(s), !Elem<Tag>::kFp8 && p.tma ? 1 : producer);
      if (Elem<Tag>::kFp8) {
        // FP8 V's staging ring (produce_fp8_by_tma): one box, read by every producer thread.
        ops.mbarrier_init(b.full_vs(s), 1);
        ops.mbarrier_init(b.empty_vs(s), producer);
      }
      // One arrival per computing consumer warp.
      ops.mbarrier_init(b.empty_k(s), kWarpsPerWarpgroup * p.consumer_warpgroups);
      ops.mbarrier_init(b.empty_v(s), kWarpsPerWarpgroup * p.consumer_warpgroups);
    }
    ops.fence_barrier_init();
  }
  ops.sync_threads();
  const int wg = ops.thread() / frag::kWarpgroupThreads;
  if (wg == 0) {
    ops.template setmaxnreg_dec<kProducerRegs>();
    produce<Tag, QK, VO>(ops, p, smem, b);
  } else {
    // Every consumer warpgroup takes its registers (the pool is split for two), then one with
    // no row in any tile of the launch (params.h's consumer_warpgroups) exits. (Exiting before
    // setmaxnreg cost the FP8 d128 consumers 24 bytes of spills, ptxas sm_90a.)
    ops.template setmaxnreg_inc<kConsumerRegs>();
    if (wg <= p.consumer_warpgroups) consume<Tag, QK, VO>(ops, p, smem, b, wg - 1);
  }
}

}  // namespace kvattn::fa3
