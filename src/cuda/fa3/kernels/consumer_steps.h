// The steps of one K/V block in an fa3 consumer warpgroup, apart so that prefill_cta.h's loop
// can order them for overlap (FA3's intra-warpgroup pipelining): issue S = Q K^T (async wgmma),
// turn S into scores (scale, soft cap, edge mask), update the online softmax (P in S's registers;
// the factor that rescales O is returned, applied once O's previous wgmma is done), pack P as the
// register A operand, issue O += P V (async wgmma). Registers that an issued wgmma reads or
// writes are fenced (ops.fence_registers) before the issue and after the wait that completes it,
// so the compiler neither moves their accesses across it nor reuses them while it runs.
// Host/device templates over the thread's operations (device_ops.cuh on the GPU; the SM90
// emulator's binding on the CPU, tests/cuda/fa3/fa3_emu_ops.h): S, O (Ops::Acc<N>) and P's fragments
// (Ops::AFrag) are plain registers on the GPU and checked registers in the emulator.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "core/numeric.h"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/named_barriers.h"
#include "cuda/fa3/kernels/pragma.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3::step {

// S = Q K^T for one block, issued and committed (one wgmma group); wait before reading s.
// A k-step is 32 bytes: k16 for 16-bit, k32 for FP8; the descriptors are the same, made once and
// advanced per k-step (smem::advance).
template <class Tag, int QK, int EB, int BN, class Ops, class SAcc>
KVATTN_HD void issue_s(const Ops& ops, SAcc& s, uint32_t q_addr, uint32_t k_addr) {
  const uint64_t q_desc = smem::encode(smem::k_major(q_addr, frag::kWarpgroupRows, 0, 0));
  const uint64_t k_desc = smem::encode(smem::k_major(k_addr, BN, 0, 0));
  ops.fence_registers(s);
  ops.wgmma_fence();
  KVATTN_FA3_PRAGMA(unroll)
  for (int ks = 0; ks < QK * EB / 32; ++ks) {
    ops.template wgmma_ss<Tag, BN>(
        s, smem::advance(q_desc, smem::k_major_step(frag::kWarpgroupRows, ks)),
        smem::advance(k_desc, smem::k_major_step(BN, ks)), ks > 0);
  }
  ops.wgmma_commit();
}

// Scores in the log2 domain (soft cap first: DESIGN.md §2 caps after sm_scale), and on the edge
// blocks the mask: keys past kv_len, the causal diagonal, the window. The diagonal of the
// thread's row half h is diag0 + token_step[h] (prefill_cta.h).
// Whether `key` is visible to a row whose causal diagonal is d (the reference's masks: the
// request's keys, causal bottom-right, the sliding window). scores() spells the same test out:
// calling this there cost the 16-bit consumers 8 bytes of spills (ptxas, sm_90a).
KVATTN_HD bool key_visible(const PrefillParams& p, int64_t key, int64_t kv_len, int64_t d) {
  return key < kv_len && (!p.causal || key <= d) && (p.window_left < 0 || key >= d - p.window_left);
}

// Without a soft cap S stays unscaled here: softmax() applies the scale inside the exp2 argument
// (exp_scale), one FFMA per score instead of a multiply here and a subtract there (FA3's way).
// With a soft cap the capped score is already in the log2 domain (exp_scale 1).
template <int BN, class SAcc>
KVATTN_HD void scores(SAcc& s, const PrefillParams& p, bool masked, int n, int64_t kv_len,
                      int64_t diag0, const int (&token_step)[2], int ctid) {
  constexpr int kSRegs = BN / 2;
  if (p.soft_cap > 0.0f) {
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kSRegs; ++i) s[i] = p.cap_log2 * tanhf(s[i] * p.score_scale_over_cap);
  }
  if (!masked) return;
  KVATTN_FA3_PRAGMA(unroll)
  for (int i = 0; i < kSRegs; ++i) {
    const int64_t key = int64_t(n) * BN + frag::acc_element(ctid, i).col;
    const int64_t d = diag0 + token_step[frag::acc_row_half(i)];
    const bool visible =
        key < kv_len && (!p.causal || key <= d) && (p.window_left < 0 || key >= d - p.window_left);
    if (!visible) s[i] = -INFINITY;
  }
}

// The factor from scores() to the log2 domain: the score scale (sm_scale, q/k scales, log2 e),
// or 1 after a soft cap (scores() applied it inside the tanh). Positive (validation: every scale
// is finite and positive), so the maximum of the unscaled scores, scaled, is the scaled maximum.
KVATTN_HD float exp_scale(const PrefillParams& p) {
  return p.soft_cap > 0.0f ? 1.0f : p.score_scale_log2;
}

// Online softmax in the log2 domain; each thread holds the keys of two rows in its accumulator
// columns, its quad the rest of each row. s (times `scale`: exp_scale) becomes P (unnormalized),
// m and l move on (in the log2 domain), alpha[h] is the factor for O's row half h. P is
// exp2(s * scale - m): one FFMA into the exp2.
template <int BN, class Ops, class SAcc>
KVATTN_HD void softmax(const Ops& ops, SAcc& s, float scale, float (&m)[2], float (&l)[2],
                       float (&alpha)[2]) {
  constexpr int kSRegs = BN / 2;
  KVATTN_FA3_PRAGMA(unroll)
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kSRegs; ++i) {
      if (frag::acc_row_half(i) == h) mx = fmaxf(mx, s[i]);
    }
    mx = fmaxf(mx, ops.shfl_xor(mx, 1));
    mx = fmaxf(mx, ops.shfl_xor(mx, 2));
    const float m_new = fmaxf(m[h], mx * scale);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row that sees nothing yet
    alpha[h] = exp2f(m[h] - m_use);
    const float neg_m = -m_use;
    float sum = 0.0f;
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kSRegs; ++i) {
      if (frag::acc_row_half(i) == h) {
        s[i] = exp2f(fmaf(s[i], scale, neg_m));
        sum += s[i];
      }
    }
    l[h] = l[h] * alpha[h] + sum;
    m[h] = m_new;
  }
}

template <int N, class OAcc>
KVATTN_HD void rescale(OAcc& o, const float (&alpha)[2]) {
  KVATTN_FA3_PRAGMA(unroll)
  for (int i = 0; i < N; ++i) o[i] *= alpha[frag::acc_row_half(i)];
}

// FP8's P is scaled by 2^8 before its e4m3 rounding (FlashAttention-3's guard against underflow:
// e4m3's smallest subnormal is 2^-9, so unscaled every P below 2^-10 would vanish; scaled, P down
// to 2^-17 keeps a value, and P = 1 becomes 2^8, exact), and O by 2^-8 in the epilogue.
inline constexpr float kFp8PScale = 256.0f;
inline constexpr float kFp8PUnscale = 1.0f / 256.0f;

// P as the register A operand: 16-bit pairs (k16 steps) or FP8 quads (k32 steps, keys renumbered
// as V^T's columns are; scaled by kFp8PScale).
template <class Tag, bool kFp8, int BN, int kPSteps, class Ops, class SAcc, class AFrag>
KVATTN_HD void pack_p(const Ops& ops, SAcc& s, AFrag (&a)[kPSteps]) {
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) {
    KVATTN_FA3_PRAGMA(unroll)
    for (int rr = 0; rr < 4; ++rr) {
      if constexpr (kFp8) {
        a[kk][rr] = ops.pack_e4m3x4(kFp8PScale * s[frag::p_a_register8(kk, rr, 0)],
                                    kFp8PScale * s[frag::p_a_register8(kk, rr, 1)],
                                    kFp8PScale * s[frag::p_a_register8(kk, rr, 2)],
                                    kFp8PScale * s[frag::p_a_register8(kk, rr, 3)]);
      } else {
        a[kk][rr] = ops.template pack16<Tag>(s[frag::p_a_register(kk, rr, 0)],
                                             s[frag::p_a_register(kk, rr, 1)]);
      }
    }
  }
}

// O += P V for one block, issued and committed (one wgmma group): 16-bit (FP8: pv_promoted).
template <class Tag, int VO, int BN, int kPSteps, class Ops, class OAcc, class AFrag>
KVATTN_HD void issue_pv(const Ops& ops, OAcc& o, AFrag (&a)[kPSteps], uint32_t v_addr) {
  static_assert(!Elem<Tag>::kFp8, "FP8's P V is pv_promoted");
  // The rescaled O and the packed P must be in their registers before wgmma.fence.
  ops.fence_registers(o);
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) ops.fence_registers(a[kk]);
  const uint64_t v_desc = smem::encode(smem::mn_major(v_addr, BN, 0));
  ops.wgmma_fence();
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) {
    ops.template wgmma_rs<Tag, VO>(o, a[kk], smem::advance(v_desc, smem::mn_major_step(BN, kk)), 1);
  }
  ops.wgmma_commit();
}

// FP8's O = alpha O + P V for one block, O kept in f32 registers: Hopper's FP8 wgmma adds with
// reduced precision (about 14 bits, DeepSeek-V3's report section 3.3.2: modelled in the emulator
// as products and accumulator aligned to the largest and the bits below dropped), so an O
// accumulated by wgmma over a long KV stalls once it is 2^13 times a block's products: at 120k
// keys the output came out 89 % low in the emulator (fa3_replay_numerics_test.cc). So each
// block's P V goes into a fresh accumulator (accumulate 0 on the first k-step; the "promotion" of
// CUTLASS's FP8 GEMMs, whose default interval, 4 k32 MMAs, is one 128-key block here) and is
// added to O by one FFMA that also applies the softmax's rescale (no separate FMUL pass over O).
// At most 128 dims per pass (head dim 256: two halves of V^T's rows), so the fresh accumulator
// takes the registers S has just freed and no more. issued() is called once the last pass is
// issued and committed, before its wait (the consumer ping-pong's end of turn).
template <class Tag, int VO, int kPSteps, class Ops, class OAcc, class AFrag, class Issued>
KVATTN_HD void pv_promoted(const Ops& ops, OAcc& o, const float (&alpha)[2], AFrag (&a)[kPSteps],
                           uint32_t v_addr, Issued&& issued) {
  static_assert(Elem<Tag>::kFp8, "16-bit P V accumulates in f32: issue_pv");
  constexpr int kN = VO < 128 ? VO : 128;  // V^T rows (dims) per pass
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) ops.fence_registers(a[kk]);
  KVATTN_FA3_PRAGMA(unroll)
  for (int part = 0; part < VO / kN; ++part) {
    typename Ops::template Acc<kN / 2> acc;
    const uint64_t v_desc = smem::encode(smem::k_major(v_addr, VO, part * kN, 0));
    ops.wgmma_fence();
    KVATTN_FA3_PRAGMA(unroll)
    for (int kk = 0; kk < kPSteps; ++kk) {
      ops.template wgmma_rs<Tag, kN>(acc, a[kk], smem::advance(v_desc, smem::k_major_step(VO, kk)),
                                     kk > 0);
    }
    ops.wgmma_commit();
    if (part == VO / kN - 1) issued();
    ops.template wgmma_wait<0>();
    ops.fence_registers(acc);
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kN / 2; ++i) {
      // Element i of the pass is element part * kN / 2 + i of O: the same row half, kN dims on.
      const int j = part * (kN / 2) + i;
      o[j] = o[j] * alpha[frag::acc_row_half(i)] + acc[i];
    }
  }
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) ops.fence_registers(a[kk]);
}

// After the wait that completes O's wgmma: O and the P it read are the compiler's again.
template <int VO, int kPSteps, class Ops, class OAcc, class AFrag>
KVATTN_HD void pv_done(const Ops& ops, OAcc& o, AFrag (&a)[kPSteps]) {
  ops.fence_registers(o);
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) ops.fence_registers(a[kk]);
}

// The numerics policy (docs/cuda.md): a masked key's V must never meet its zero weight (0 x inf
// = NaN would poison rows that do not see the key). Only the edge blocks (kr.masked) hold keys
// some row does not see (the causal diagonal, the window, keys past kv_len: zeros for cp.async,
// but the next request's keys in a ragged TMA box); for those, the consumer warpgroup checks the
// block's V tile for an inf or NaN (each thread a share; bar.red.or makes the answer the
// warpgroup's, as wgmma must be) and, where there is one, computes O += P V with guarded_pv.
template <class Tag>
KVATTN_HD bool non_finite_word(uint32_t w) {
  if constexpr (Elem<Tag>::kFp8) {
    const uint32_t m = Elem<Tag>::kKv == ElemKind::kE4m3 ? 0x7fu : 0x7cu;  // e4m3: NaN only
    bool any = false;
    KVATTN_FA3_PRAGMA(unroll)
    for (int b = 0; b < 4; ++b) any = any || ((w >> (8 * b)) & m) == m;
    return any;
  } else {
    const uint32_t m = Elem<Tag>::kKv == ElemKind::kF16 ? 0x7c00u : 0x7f80u;
    return (w & m) == m || ((w >> 16) & m) == m;
  }
}
template <class Tag, int VO, int BN, class Ops>
KVATTN_HD bool v_has_non_finite(const Ops& ops, const uint8_t* v_smem, int ctid, int wg) {
  constexpr bool kFp8 = Elem<Tag>::kFp8;
  constexpr int kRows = kFp8 ? VO : BN;  // V^T [dim][key] or V [key][dim]
  constexpr int kRowChunks = (kFp8 ? BN : 2 * VO) / 16;
  bool bad = false;
  for (int c = ctid; c < kRows * kRowChunks; c += frag::kWarpgroupThreads) {
    const int row = c / kRowChunks, chunk = c % kRowChunks;
    const uint32_t off =
        kFp8 ? smem::tile_offset8(row, 16 * chunk, VO) : smem::tile_offset(row, 8 * chunk, BN);
    const typename Ops::U4 x =
        ops.ld_shared(reinterpret_cast<const typename Ops::U4*>(v_smem + off));
    bad = bad || non_finite_word<Tag>(x.x) || non_finite_word<Tag>(x.y) ||
          non_finite_word<Tag>(x.z) || non_finite_word<Tag>(x.w);
  }
  return ops.named_barrier_red_or(bar::warpgroup(wg), frag::kWarpgroupThreads, bad);
}

// Element (key j, dim col) of a V tile: 16-bit V [key][dim], FP8 V^T [dim][renumbered key].
template <class Tag, int VO, int BN, class Ops>
KVATTN_HD float v_value(const Ops& ops, const uint8_t* v_smem, int j, int col) {
  if constexpr (Elem<Tag>::kFp8) {
    const int kcol = (j / 32) * 32 + frag::fp8_column_of_key(j % 32);
    const uint8_t x = ops.ld_shared(v_smem + smem::tile_offset8(col, kcol, VO));
    return Elem<Tag>::kKv == ElemKind::kE4m3 ? num::e4m3_to_f32(x) : num::e5m2_to_f32(x);
  } else {
    const uint16_t x =
        ops.ld_shared(reinterpret_cast<const uint16_t*>(v_smem + smem::tile_offset(j, col, BN)));
    return Elem<Tag>::kKv == ElemKind::kF16 ? num::f16_to_f32(x) : num::bf16_to_f32(x);
  }
}

// O += P V for block n without wgmma (its V holds an inf or NaN): each thread adds to its O
// registers P x V of the keys its rows see, and nothing of the others. A row's P is spread over
// its quad: FP8 takes it from S's registers (times kFp8PScale: O carries P's 2^8), 16-bit from
// the packed A fragments (P as the wgmma would read it), one shuffle per (key, row half). The
// key loop stays a loop; registers are only ever indexed by constants (a select picks the
// register of key j), so nothing goes to local memory.
template <class Tag, int VO, int BN, int kPSteps, class Ops, class OAcc, class SAcc, class AFrag>
KVATTN_HD void guarded_pv(const Ops& ops, OAcc& o, SAcc& s, AFrag (&a)[kPSteps],
                          const uint8_t* v_smem, const PrefillParams& p, int n, int64_t kv_len,
                          int64_t diag0, const int (&token_step)[2], int ctid) {
  const int quad = (ctid % 32) & ~3;
  KVATTN_FA3_PRAGMA(unroll 1)
  for (int j = 0; j < BN; ++j) {
    const int64_t key = int64_t(n) * BN + j;
    KVATTN_FA3_PRAGMA(unroll)
    for (int h = 0; h < 2; ++h) {
      float pj;
      if constexpr (Elem<Tag>::kFp8) {
        const int want = 4 * (j / 8) + 2 * h + j % 2;  // S register of (row half h, key j)
        float mine = 0.0f;
        KVATTN_FA3_PRAGMA(unroll)
        for (int i = 0; i < BN / 2; ++i) {
          if (i == want) mine = s[i];
        }
        pj = kFp8PScale * ops.shfl(mine, quad + (j % 8) / 2);
      } else {
        const int jj = j % 16;  // A register 2 (jj / 8) + h of k-step j / 16, half jj % 2
        const int want = 4 * (j / 16) + 2 * (jj / 8) + h;
        uint32_t mine = 0;
        KVATTN_FA3_PRAGMA(unroll)
        for (int kk = 0; kk < kPSteps; ++kk) {
          KVATTN_FA3_PRAGMA(unroll)
          for (int r = 0; r < 4; ++r) {
            if (4 * kk + r == want) mine = a[kk][r];
          }
        }
        const uint32_t w = ops.shfl_u32(mine, quad + (jj % 8) / 2);
        const uint16_t bits = uint16_t(jj % 2 ? w >> 16 : w & 0xffffu);
        pj = Elem<Tag>::kQ == ElemKind::kF16 ? num::f16_to_f32(bits) : num::bf16_to_f32(bits);
      }
      if (!key_visible(p, key, kv_len, diag0 + token_step[h])) continue;
      KVATTN_FA3_PRAGMA(unroll)
      for (int i = 0; i < VO / 2; ++i) {
        if (frag::acc_row_half(i) != h) continue;
        o[i] += pj * v_value<Tag, VO, BN>(ops, v_smem, j, frag::acc_element(ctid, i).col);
      }
    }
  }
}

}  // namespace kvattn::fa3::step
