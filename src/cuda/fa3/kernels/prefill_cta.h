// fa3's attention kernel body (prefill and decode), written once for the GPU and the CPU: a
// host/device template over the thread-level operations of one SM90 CTA (Ops: device_ops.cuh's
// DeviceOps, the PTX of sm90_ptx.cuh, on the GPU; tests/cuda/fa3/fa3_emu_ops.h's binding to the SM90
// CTA emulator, tests/cuda/emulator/sm90_emulator.h, on the CPU, where tests/cuda/fa3/fa3_replay_test.cc runs
// this exact code against the fp64 reference). What the body does: prefill.cuh's header.
// This file: the consumer warpgroups (consume) and the CTA's entry (prefill_cta); the producer
// is producer.h (its copies kv_copies.h), the threads, shared-memory plan and mbarriers
// cta_layout.h.
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
#include "cuda/fa3/kernels/cta_layout.h"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/epilogue.h"
#include "cuda/fa3/kernels/l2_hint.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/pipeline_state.h"
#include "cuda/fa3/kernels/producer.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/tile_size.h"
#include "cuda/fa3/kernels/v_transpose.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

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
