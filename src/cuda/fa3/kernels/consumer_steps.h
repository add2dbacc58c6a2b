// The steps of one K/V block in an fa3 consumer warpgroup, apart so that prefill_cta.h's loop
// can order them for overlap (FA3's intra-warpgroup pipelining): issue S = Q K^T (async wgmma),
// turn S into scores (scale, soft cap, edge mask), update the online softmax (P in S's registers;
// the factor that rescales O is returned, applied once O's previous wgmma is done), pack P as the
// register A operand, issue O += P V (async wgmma). Registers that an issued wgmma reads or
// writes are fenced (ops.fence_registers) before the issue and after the wait that completes it,
// so the compiler neither moves their accesses across it nor reuses them while it runs.
// Host/device templates over the thread's operations (device_ops.cuh on the GPU; the SM90
// emulator's binding on the CPU, tests/cuda/fa3_emu_ops.h): S, O (Ops::Acc<N>) and P's fragments
// (Ops::AFrag) are plain registers on the GPU and checked registers in the emulator.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/fa3/params.h"

#if defined(__CUDACC__)
#define KVATTN_FA3_PRAGMA(x) _Pragma(#x)
#else
#define KVATTN_FA3_PRAGMA(x)
#endif

namespace kvattn::fa3::step {

// S = Q K^T for one block, issued and committed (one wgmma group); wait before reading s.
// A k-step is 32 bytes: k16 for 16-bit, k32 for FP8; the descriptors are the same.
template <class Tag, int QK, int EB, int BN, class Ops, class SAcc>
KVATTN_HD void issue_s(const Ops& ops, SAcc& s, uint32_t q_addr, uint32_t k_addr) {
  ops.fence_registers(s);
  ops.wgmma_fence();
  KVATTN_FA3_PRAGMA(unroll)
  for (int ks = 0; ks < QK * EB / 32; ++ks) {
    ops.template wgmma_ss<Tag, BN>(s,
                                   smem::encode(smem::k_major(q_addr, frag::kWarpgroupRows, 0, ks)),
                                   smem::encode(smem::k_major(k_addr, BN, 0, ks)), ks > 0);
  }
  ops.wgmma_commit();
}

// Scores in the log2 domain (soft cap first: DESIGN.md §2 caps after sm_scale), and on the edge
// blocks the mask: keys past kv_len, the causal diagonal, the window. The diagonal of the
// thread's row half h is diag0 + token_step[h] (prefill_cta.h).
template <int BN, class SAcc>
KVATTN_HD void scores(SAcc& s, const PrefillParams& p, bool masked, int n, int64_t kv_len,
                      int64_t diag0, const int (&token_step)[2], int ctid) {
  constexpr int kSRegs = BN / 2;
  if (p.soft_cap > 0.0f) {
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kSRegs; ++i) s[i] = p.cap_log2 * tanhf(s[i] * p.score_scale_over_cap);
  } else {
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kSRegs; ++i) s[i] *= p.score_scale_log2;
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

// Online softmax in the log2 domain; each thread holds the keys of two rows in its accumulator
// columns, its quad the rest of each row. s becomes P (unnormalized), m and l move on, alpha[h]
// is the factor for O's row half h.
template <int BN, class Ops, class SAcc>
KVATTN_HD void softmax(const Ops& ops, SAcc& s, float (&m)[2], float (&l)[2], float (&alpha)[2]) {
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
    const float m_new = fmaxf(m[h], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row that sees nothing yet
    alpha[h] = exp2f(m[h] - m_use);
    float sum = 0.0f;
    KVATTN_FA3_PRAGMA(unroll)
    for (int i = 0; i < kSRegs; ++i) {
      if (frag::acc_row_half(i) == h) {
        s[i] = exp2f(s[i] - m_use);
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

// O += P V for one block, issued and committed (one wgmma group).
template <class Tag, bool kFp8, int VO, int BN, int kPSteps, class Ops, class OAcc, class AFrag>
KVATTN_HD void issue_pv(const Ops& ops, OAcc& o, AFrag (&a)[kPSteps], uint32_t v_addr) {
  // The rescaled O and the packed P must be in their registers before wgmma.fence.
  ops.fence_registers(o);
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) ops.fence_registers(a[kk]);
  ops.wgmma_fence();
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) {
    if constexpr (kFp8) {
      ops.template wgmma_rs<Tag, VO>(o, a[kk], smem::encode(smem::k_major(v_addr, VO, 0, kk)));
    } else {
      ops.template wgmma_rs<Tag, VO>(o, a[kk], smem::encode(smem::mn_major(v_addr, BN, kk)));
    }
  }
  ops.wgmma_commit();
}

// After the wait that completes O's wgmma: O and the P it read are the compiler's again.
template <int VO, int kPSteps, class Ops, class OAcc, class AFrag>
KVATTN_HD void pv_done(const Ops& ops, OAcc& o, AFrag (&a)[kPSteps]) {
  ops.fence_registers(o);
  KVATTN_FA3_PRAGMA(unroll)
  for (int kk = 0; kk < kPSteps; ++kk) ops.fence_registers(a[kk]);
}

}  // namespace kvattn::fa3::step
