// fa2's attention kernel body, FlashAttention-2 style, written once for the GPU and the CPU: a
// host/device template over the thread-level operations of cta_ops.h (DeviceOps on the GPU; the
// CPU emulator of tests/cuda/emulator/cta_emulator.h runs this exact code, one std::thread per CUDA
// thread, in tests/cuda/fa2/cta_replay_test.cc). One CTA is one work unit: packed query rows of a
// request and KV head against one KV chunk.
//
// Two tiles (issue 13):
//   prefill - 4 warps (2 for 512-wide heads) split the query rows, 16 each; every warp attends
//             the whole K/V block;
//   decode  - one 16-row MMA tile; 4 warps split each 64-key K/V block (16 keys each), keep
//             their own online-softmax state, and merge (m, l, o) through shared memory in the
//             epilogue, all threads sharing the copies and the conversions.
// Per K/V block, in the FlashAttention-2 order (K(b+1) issued before S(b), V(b+1) before PV(b),
// double-buffered when two stages fit in 99 KiB, else K and V alternate on one stage):
//   loader    - 16-bit caches: cp.async straight into the swizzled tile (zero-filled past the
//               keys), then, only when needed (the other 16-bit type, RoPE on K, per-head or
//               per-token scales), an in-place pass 8 elements at a time; FP8 caches: cp.async
//               into a raw stage, decoded 8 elements (two paired conversions) per step into a
//               16-bit tile with 16-byte stores;
//   mainloop  - S = Q K^T with ldmatrix + mma.m16n8k16, score transforms and masks in
//               registers (no mask test for blocks every row fully sees; the custom mask is a
//               template parameter), online softmax, O += P V with P reused from S's registers;
//   epilogue  - normalize and write o (and lse) with paired stores, or a partial state for the
//               split-KV merge.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/attention_math.h"
#include "core/hd.h"
#include "core/math_constants.h"
#include "core/split_kv.h"
#include "cuda/fa2/kernels/epilogue.h"
#include "cuda/fa2/kernels/formats.h"
#include "cuda/fa2/kernels/fragment_layout.h"
#include "cuda/fa2/kernels/online_softmax.h"
#include "cuda/fa2/kernels/tile_loader.h"
#include "cuda/fa2/kernels/unit_math.h"
#include "cuda/fa2/params.h"

namespace kvattn::fa2 {

KVATTN_HD constexpr int cmax(int a, int b) { return a > b ? a : b; }

// The 16-bit type the tiles and MMAs use: f16 when q or a 16-bit cache is f16, else bf16. q's
// own type for every same-type pair; for the mixed pairs both operands are exact in f16 inside
// f16's range (bf16 has 8 mantissa bits, f16 11), whereas bf16 would round f16 values to 8 bits
// (measured: bf16 q over an f16 cache then misses the LSE tolerance). A bf16 value beyond
// f16's range (|x| > 65504) becomes inf, so the output is inf/NaN, never silently finite.
template <class QIn, class KV>
struct ComputeFormat {
  using type =
      std::conditional_t<QIn::kF16 || (KV::k16 && KV::Format::kF16), F16Format, Bf16Format>;
};

template <class QIn_, class KV_, int kDqk_, int kDvo_, bool kDecode_, bool kCustomMask_>
struct AttentionConfig {
  using QIn = QIn_;  // q's format in memory
  using KV = KV_;
  using QFmt = typename ComputeFormat<QIn, KV>::type;  // the tiles' and the MMAs' format
  using Raw = typename KV::Raw;
  static constexpr bool kDecode = kDecode_;
  static constexpr bool kCustomMask = kCustomMask_;
  static constexpr int kDqk = kDqk_;
  static constexpr int kDvo = kDvo_;
  static constexpr int kRowWarps = kDecode ? 1 : prefill_warps(kDqk);
  static constexpr int kKeyWarps = kDecode ? decode_key_warps(kDqk) : 1;
  static constexpr int kWarps = kRowWarps * kKeyWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kRowWarps * kWarpRows;
  static constexpr int kKeys = kDecode ? decode_block_keys(kDqk) : kv_block_keys(kDqk);
  static constexpr int kWarpKeys = kKeys / kKeyWarps;  // keys of a block each warp attends
  static constexpr int kNTiles = kWarpKeys / 8;        // 8-key n-tiles of S per warp
  // Shared-memory rows of the swizzled 16-bit tiles (padded, params.h smem_row).
  static constexpr int kDqkRow = smem_row(kDqk);
  static constexpr int kDvoRow = smem_row(kDvo);
  static constexpr bool k16 = KV::k16;
  // A stage holds one K block and one V block as copied: the swizzled 16-bit tiles themselves
  // for 16-bit caches, raw rows for FP8 (decoded into kConvBytes, one 16-bit tile K and V share).
  static constexpr int kKStageBytes = k16 ? kKeys * kDqkRow * 2 : kKeys * kDqk;
  static constexpr int kVStageBytes = k16 ? kKeys * kDvoRow * 2 : kKeys * kDvo;
  static constexpr int kStageBytes = kKStageBytes + kVStageBytes;
  static constexpr int kConvBytes = k16 ? 0 : kKeys * cmax(kDqkRow, kDvoRow) * 2;
  static constexpr int kQBytes = kRows * kDqkRow * 2;
  static constexpr int kRopeBytes = kDqk / 2 * 4;   // RoPE inverse frequencies, once per CTA
  static constexpr int kKeyScaleBytes = kKeys * 4;  // a block's granular K scales (f32)
  static constexpr int bytes_for(int stages) {
    return kQBytes + kRopeBytes + kKeyScaleBytes + stages * kStageBytes + kConvBytes;
  }
  static constexpr int kMaxSmem = 99 * 1024;  // SM86/SM89's limit per block
  static constexpr int kStages = bytes_for(2) <= kMaxSmem ? 2 : 1;
  // The decode epilogue's (m, l, o) of each key warp, over the (then idle) stages.
  static constexpr int kMergeBytes = kDecode ? kKeyWarps * kWarpRows * (kDvo + 2) * 4 : 0;
  static constexpr int kKeyScaleOffset = kQBytes + kRopeBytes;
  static constexpr int kStageOffset = kKeyScaleOffset + kKeyScaleBytes;
  static constexpr int kConvOffset = kStageOffset + kStages * kStageBytes;
  static constexpr int kSmemBytes = cmax(bytes_for(kStages), kStageOffset + kMergeBytes);

  // The swizzle permutes 16-byte chunks within groups of 8, so a tile row is a multiple of 64
  // elements (padded); the MMAs step 16 dims at a time, and a fix-up or decode step takes a
  // 16-byte chunk (8 elements) and its RoPE partner half a row away.
  static_assert(kDqkRow % 64 == 0 && kDvoRow % 64 == 0, "tile rows must be multiples of 64");
  static_assert(kDqk % 16 == 0 && kDvo % 16 == 0, "head dims must be multiples of 16");
  static_assert(kWarpKeys % 16 == 0, "a warp's keys are whole MMA k-steps");
  static_assert(bytes_for(kStages) <= kMaxSmem && kSmemBytes <= kMaxSmem,
                "shared memory must fit SM86/SM89's 99 KiB per block");
};

// ---- Mainloop -------------------------------------------------------------------------------
// S = Q K^T for this warp's rows (row warp rw) and keys (key warp kw) of the block, times each
// key's granular K scale where there is one (`key_scale`, the block's, null otherwise), the score
// transforms and masks (DESIGN.md §2's order: scale, soft cap, ALiBi, then the masks), and the
// online-softmax update. Leaves the probabilities in s.
template <class C, class Ops>
KVATTN_HD void scores_block(const Ops& ops, const AttentionParams& p, const RequestInfo& r,
                            const RowInfo (&rows)[2], int64_t block_begin,
                            const split::ChunkRange& keys, const uint16_t* q_s,
                            const uint16_t* k_tile, const float* key_scale, bool fully_visible,
                            float (&s)[C::kNTiles][4], Accumulators<C>& acc) {
  constexpr float kLog2e = math::kLog2e;
  const int warp = ops.thread() / 32, lane = ops.thread() % 32;
  const int rw = warp % C::kRowWarps, kw = warp / C::kRowWarps;
  const int key0 = kw * C::kWarpKeys;
  KVATTN_UNROLL
  for (int nt = 0; nt < C::kNTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
  KVATTN_UNROLL
  for (int ks = 0; ks < C::kDqk / 16; ++ks) {
    uint32_t a[4];
    const frag::RowCol qa = frag::q_ldmatrix(rw, lane, ks);
    ops.ldmatrix_x4(a, q_s + frag::swizzled(qa.row, qa.col, C::kDqkRow));
    KVATTN_UNROLL
    for (int nt2 = 0; nt2 < C::kNTiles / 2; ++nt2) {
      // b0,b1 of the two 8-key n-tiles 2 nt2 and 2 nt2 + 1 (fragment_layout.h).
      uint32_t b[4];
      const frag::RowCol kb = frag::k_ldmatrix(lane, nt2, ks);
      ops.ldmatrix_x4(b, k_tile + frag::swizzled(key0 + kb.row, kb.col, C::kDqkRow));
      ops.template mma<typename C::QFmt>(s[2 * nt2], a, b[0], b[1]);
      ops.template mma<typename C::QFmt>(s[2 * nt2 + 1], a, b[2], b[3]);
    }
  }
  if (key_scale) {  // uniform: only granular FP8 scales
    KVATTN_UNROLL
    for (int nt = 0; nt < C::kNTiles; ++nt) {
      KVATTN_UNROLL
      for (int e = 0; e < 4; ++e)
        s[nt][e] *= key_scale[key0 + nt * 8 + frag::acc_element(lane, e).col];
    }
  }
  const int64_t first_key = block_begin + key0;
  if (!C::kDecode && fully_visible && p.soft_cap <= 0.0f && !p.alibi) {
    // The common prefill block: no mask, no soft cap, no ALiBi: one multiply a score (the decode
    // tile keeps the general form, as it keeps its V check: see below).
    const float scale = p.score_scale * kLog2e;
    KVATTN_UNROLL
    for (int nt = 0; nt < C::kNTiles; ++nt) {
      KVATTN_UNROLL
      for (int e = 0; e < 4; ++e) s[nt][e] *= scale;
    }
  } else if (fully_visible) {
    KVATTN_UNROLL
    for (int nt = 0; nt < C::kNTiles; ++nt) {
      KVATTN_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int64_t j = first_key + nt * 8 + frag::acc_element(lane, e).col;
        s[nt][e] = transformed_score(p, rows[e >> 1], j, s[nt][e]) * kLog2e;
      }
    }
  } else {
    KVATTN_UNROLL
    for (int nt = 0; nt < C::kNTiles; ++nt) {
      KVATTN_UNROLL
      for (int e = 0; e < 4; ++e) {
        const RowInfo& ri = rows[e >> 1];
        const int64_t j = first_key + nt * 8 + frag::acc_element(lane, e).col;
        s[nt][e] = row_sees_key<C::kCustomMask>(p, r, ri, keys, j)
                       ? transformed_score(p, ri, j, s[nt][e]) * kLog2e
                       : -INFINITY;
      }
    }
  }
  // Online softmax, one row half at a time (online_softmax.h); the quad shares each row.
  KVATTN_UNROLL
  for (int half = 0; half < 2; ++half) {
    float block_max = lane_block_max(s, half);
    block_max = fmaxf(block_max, ops.shfl_xor(block_max, 1));
    block_max = fmaxf(block_max, ops.shfl_xor(block_max, 2));
    softmax_block_update(s, acc.o, acc.m[half], acc.l[half], half, block_max);
  }
}

// O += P V for this warp's keys of the block. A block whose V holds a non-finite value among
// keys some row does not see takes guarded_pv (masked keys add nothing, never 0 * inf).
template <class C, class Ops>
KVATTN_HD void pv_block(const Ops& ops, const uint16_t* v_tile, bool nonfinite_v,
                        float (&s)[C::kNTiles][4], Accumulators<C>& acc) {
  const int warp = ops.thread() / 32, lane = ops.thread() % 32;
  const int key0 = (warp / C::kRowWarps) * C::kWarpKeys;
  if (nonfinite_v) {  // uniform over the CTA (a sync_or): no divergent shuffles
    guarded_pv<C::kNTiles, C::kDvo / 8>(
        acc.o, lane, [&](int nt, int e, int q) { return ops.shfl(s[nt][e], (lane & ~3) | q); },
        [&](int j, int d) {
          return C::QFmt::to_float(v_tile[frag::swizzled(key0 + j, d, C::kDvoRow)]);
        });
    return;
  }
  // The S accumulators of n-tiles 2kk and 2kk+1 are exactly the A fragment of k-step kk.
  KVATTN_UNROLL
  for (int kk = 0; kk < C::kWarpKeys / 16; ++kk) {
    const uint32_t a[4] = {C::QFmt::pack(s[2 * kk][0], s[2 * kk][1]),
                           C::QFmt::pack(s[2 * kk][2], s[2 * kk][3]),
                           C::QFmt::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           C::QFmt::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    KVATTN_UNROLL
    for (int dt2 = 0; dt2 < C::kDvo / 16; ++dt2) {
      // b0,b1 of the two 8-dim tiles 2 dt2 and 2 dt2 + 1 (fragment_layout.h).
      uint32_t b[4];
      const frag::RowCol vb = frag::v_ldmatrix_trans(lane, kk, dt2);
      ops.ldmatrix_x4_trans(b, v_tile + frag::swizzled(key0 + vb.row, vb.col, C::kDvoRow));
      ops.template mma<typename C::QFmt>(acc.o[2 * dt2], a, b[0], b[1]);
      ops.template mma<typename C::QFmt>(acc.o[2 * dt2 + 1], a, b[2], b[3]);
    }
  }
}

// ---- The CTA --------------------------------------------------------------------------------
// One work unit (`unit`: blockIdx.x on the GPU). smem: C::kSmemBytes, 16-byte aligned.
template <class C, class Ops>
KVATTN_HD void attention_cta(const Ops& ops, const AttentionParams& p, unsigned char* smem,
                             int unit) {
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);
  float* inv_freq = reinterpret_cast<float*>(smem + C::kQBytes);
  float* key_scale = reinterpret_cast<float*>(smem + C::kKeyScaleOffset);
  unsigned char* stages = smem + C::kStageOffset;
  uint16_t* conv = reinterpret_cast<uint16_t*>(smem + C::kConvOffset);
  auto k_stage = [&](int64_t b) { return stages + int(b % C::kStages) * C::kStageBytes; };
  auto v_stage = [&](int64_t b) { return k_stage(b) + C::kKStageBytes; };
  // The tiles the MMAs read: the stage itself for 16-bit caches, the conversion tile for FP8.
  auto k_tile = [&](int64_t b) { return C::k16 ? reinterpret_cast<uint16_t*>(k_stage(b)) : conv; };
  auto v_tile = [&](int64_t b) { return C::k16 ? reinterpret_cast<uint16_t*>(v_stage(b)) : conv; };

  const WorkUnit w = p.work[unit];
  const RequestInfo r = p.requests[w.request];
  const split::ChunkRange keys = unit_key_range(p, w, r);
  const int64_t kv_lo = keys.begin, kv_hi = keys.end;
  const int64_t num_blocks = kv_hi > kv_lo ? (kv_hi - kv_lo + C::kKeys - 1) / C::kKeys : 0;

  auto issue_k = [&](int64_t b) {
    if (b < num_blocks)
      issue_rows<C, C::kDqk>(ops, p, p.k, p.k_strides, r, w.kv_head, kv_lo + b * C::kKeys, kv_hi,
                             k_stage(b));
    ops.cp_async_commit();  // empty past the last block: every wait counts the same groups
  };
  auto issue_v = [&](int64_t b) {
    if (b < num_blocks)
      issue_rows<C, C::kDvo>(ops, p, p.v, p.v_strides, r, w.kv_head, kv_lo + b * C::kKeys, kv_hi,
                             v_stage(b));
    ops.cp_async_commit();
  };

  // K/V block 0 is in flight while the RoPE table and Q are made.
  if (num_blocks > 0) {
    issue_k(0);
    issue_v(0);
  }
  if (p.rope) {
    for (int t = ops.thread(); t < C::kDqk / 2; t += C::kThreads)
      inv_freq[t] = powf(p.rope_theta, -2.0f * float(t) / float(C::kDqk));
  }
  load_q_tile<C>(ops, p, w, r, q_s);

  const int warp = ops.thread() / 32, lane = ops.thread() % 32;
  const int rw = warp % C::kRowWarps;
  const RowInfo rows[2] = {row_info(p, w, r, rw * 16 + frag::acc_element(lane, 0).row),
                           row_info(p, w, r, rw * 16 + frag::acc_element(lane, 2).row)};
  Accumulators<C> acc;
  KVATTN_UNROLL
  for (int dt = 0; dt < C::kDvo / 8; ++dt)
    acc.o[dt][0] = acc.o[dt][1] = acc.o[dt][2] = acc.o[dt][3] = 0.0f;
  acc.m[0] = acc.m[1] = -INFINITY;
  acc.l[0] = acc.l[1] = 0.0f;

  using KV = typename C::KV;
  constexpr bool kSameType = C::k16 && std::is_same_v<typename KV::Format, typename C::QFmt>;
  const bool k_granular = p.k_head_scale || p.k_scale_cache;
  const bool v_granular = p.v_head_scale || p.v_scale_cache;
  const TileFix k_fix{!kSameType || p.rope || k_granular,
                      p.rope,
                      p.k_head_scale,
                      p.k_head_scale_stride,
                      p.k_scale_cache,
                      &p.ks_strides,
                      k_granular ? key_scale : nullptr};
  const TileFix v_fix{
      !kSameType || v_granular, false,         p.v_head_scale, p.v_head_scale_stride,
      p.v_scale_cache,          &p.vs_strides, nullptr};
  constexpr int kPending = C::kStages == 2 ? 2 : 1;

  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t block_begin = kv_lo + b * C::kKeys;
    if constexpr (C::kStages == 2) issue_k(b + 1);
    // K(b) has landed, and every warp is past block b-1's scores (and Q is written).
    ops.template cp_async_wait<kPending>();
    ops.sync();
    if (k_fix.needed) {
      fix_tile<C, C::kDqk>(ops, p, r, w.kv_head, block_begin, kv_hi, k_fix, k_stage(b), k_tile(b),
                           inv_freq, false);
      ops.sync();
    }
    const bool fully_visible = block_fully_visible(p, w, r, keys, block_begin, C::kKeys);
    float s[C::kNTiles][4];
    scores_block<C>(ops, p, r, rows, block_begin, keys, q_s, k_tile(b), k_fix.key_scale,
                    fully_visible, s, acc);
    if constexpr (C::kStages == 2) {
      issue_v(b + 1);
    } else {
      ops.sync();  // every warp is done with K(b): its stage takes K(b+1)
      issue_k(b + 1);
    }
    // V(b) has landed, and every warp is past block b-1's PV (and block b's scores).
    ops.template cp_async_wait<kPending>();
    ops.sync();
    // Keys some row does not see (masked, or past the keys: those are zeros) must add nothing
    // even with an inf/NaN V: blocks holding such keys learn whether their V is finite. The V
    // pass checks only those blocks in prefill; the decode tile keeps its check on every block
    // and its code as it was: with this pass's prefill changes applied to it too, decode ran
    // 3-14 % slower on an H200, still ~10 % with only this conditional check left different
    // (docs/cuda.md, "The second GPU run"; the cause was not found).
    bool nonfinite_v = false;
    if (v_fix.needed) {
      nonfinite_v = ops.sync_or(fix_tile<C, C::kDvo>(ops, p, r, w.kv_head, block_begin, kv_hi,
                                                     v_fix, v_stage(b), v_tile(b), inv_freq,
                                                     C::kDecode || !fully_visible) &&
                                !fully_visible);
    } else if (!fully_visible) {
      nonfinite_v = ops.sync_or(scan_nonfinite<C>(ops, block_begin, kv_hi, v_tile(b)));
    }
    pv_block<C>(ops, v_tile(b), nonfinite_v, s, acc);
    if constexpr (C::kStages == 1) {
      ops.sync();  // every warp is done with V(b)
      issue_v(b + 1);
    }
  }
  // Only empty groups can be pending here; waiting for them keeps the decode merge's overlay
  // of the stages safe by construction.
  ops.template cp_async_wait<0>();
  if constexpr (C::kDecode) {
    merge_store_rows<C>(ops, p, w, r, acc, reinterpret_cast<float*>(stages));
  } else {
    store_rows<C>(ops, p, w, r, rows, acc);
  }
}

}  // namespace kvattn::fa2
