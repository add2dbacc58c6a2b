// fa3's producer warpgroup: the walk of the CTA's tiles that loads K and V into their rings (TMA
// boxes, or cp.async / gathered rows; FP8 V staged by TMA and transposed) and Q into each consumer
// warpgroup's tile (produce_q, the Q warp), behind the mbarriers of cta_layout.h.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "cuda/fa3/kernels/cta_layout.h"
#include "cuda/fa3/kernels/kv_copies.h"
#include "cuda/fa3/kernels/l2_hint.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/pipeline_state.h"
#include "cuda/fa3/kernels/pragma.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {


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

}  // namespace kvattn::fa3
