// The steps of one K/V block in an fa3 consumer warpgroup, apart so that prefill.cuh's loop can
// order them for overlap (FA3's intra-warpgroup pipelining): issue S = Q K^T (async wgmma), turn S
// into scores (scale, soft cap, edge mask), update the online softmax (P in S's registers; the
// factor that rescales O is returned, applied once O's previous wgmma is done), pack P as the
// register A operand, issue O += P V (async wgmma). Registers that an issued wgmma reads or
// writes are fenced (ptx::fence_registers) before the issue and after the wait that completes
// it, so the compiler neither moves their accesses across it nor reuses them while it runs.
#pragma once

#include <cstdint>

#include "cuda/fa3/kernels/sm90_ptx.cuh"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3::step {

// S = Q K^T for one block, issued and committed (one wgmma group); wait before reading s.
// A k-step is 32 bytes: k16 for 16-bit, k32 for FP8; the descriptors are the same.
template <class Tag, int QK, int EB, int BN>
__device__ __forceinline__ void issue_s(float (&s)[BN / 2], uint32_t q_addr, uint32_t k_addr) {
  ptx::fence_registers(s);
  ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < QK * EB / 32; ++ks) {
    ptx::wgmma_ss<Tag, BN>(s, smem::encode(smem::k_major(q_addr, frag::kWarpgroupRows, 0, ks)),
                           smem::encode(smem::k_major(k_addr, BN, 0, ks)), ks > 0);
  }
  ptx::wgmma_commit();
}

// Scores in the log2 domain (soft cap first: DESIGN.md §2 caps after sm_scale), and on the edge
// blocks the mask: keys past kv_len, the causal diagonal, the window. The diagonal of the
// thread's row half h is diag0 + token_step[h] (prefill.cuh).
template <int BN>
__device__ __forceinline__ void scores(float (&s)[BN / 2], const PrefillParams& p, bool masked,
                                       int n, int64_t kv_len, int64_t diag0,
                                       const int (&token_step)[2], int ctid) {
  constexpr int kSRegs = BN / 2;
  if (p.soft_cap > 0.0f) {
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] = p.cap_log2 * tanhf(s[i] * p.score_scale_over_cap);
  } else {
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] *= p.score_scale_log2;
  }
  if (!masked) return;
#pragma unroll
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
template <int BN>
__device__ __forceinline__ void softmax(float (&s)[BN / 2], float (&m)[2], float (&l)[2],
                                        float (&alpha)[2]) {
  constexpr int kSRegs = BN / 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) {
      if (frag::acc_row_half(i) == h) mx = fmaxf(mx, s[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row that sees nothing yet
    alpha[h] = exp2f(m[h] - m_use);
    float sum = 0.0f;
#pragma unroll
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

template <int N>
__device__ __forceinline__ void rescale(float (&o)[N], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] *= alpha[frag::acc_row_half(i)];
}

// FP8's P is scaled by 2^8 before its e4m3 rounding (FlashAttention-3's guard against underflow:
// e4m3's smallest subnormal is 2^-9, so unscaled every P below 2^-10 would vanish; scaled, P down
// to 2^-17 keeps a value, and P = 1 becomes 2^8, exact), and O by 2^-8 in the epilogue.
inline constexpr float kFp8PScale = 256.0f;
inline constexpr float kFp8PUnscale = 1.0f / 256.0f;

// P as the register A operand: 16-bit pairs (k16 steps) or FP8 quads (k32 steps, keys renumbered
// as V^T's columns are; scaled by kFp8PScale).
template <class Tag, bool kFp8, int BN, int kPSteps>
__device__ __forceinline__ void pack_p(const float (&s)[BN / 2], uint32_t (&a)[kPSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      if constexpr (kFp8) {
        a[kk][rr] = ptx::pack_e4m3x4(kFp8PScale * s[frag::p_a_register8(kk, rr, 0)],
                                     kFp8PScale * s[frag::p_a_register8(kk, rr, 1)],
                                     kFp8PScale * s[frag::p_a_register8(kk, rr, 2)],
                                     kFp8PScale * s[frag::p_a_register8(kk, rr, 3)]);
      } else {
        a[kk][rr] = cuda::Compute16<Tag>::pack(s[frag::p_a_register(kk, rr, 0)],
                                               s[frag::p_a_register(kk, rr, 1)]);
      }
    }
  }
}

// O += P V for one block, issued and committed (one wgmma group).
template <class Tag, bool kFp8, int VO, int BN, int kPSteps>
__device__ __forceinline__ void issue_pv(float (&o)[VO / 2], uint32_t (&a)[kPSteps][4],
                                         uint32_t v_addr) {
  // The rescaled O and the packed P must be in their registers before wgmma.fence.
  ptx::fence_registers(o);
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) ptx::fence_registers(a[kk]);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
    if constexpr (kFp8) {
      ptx::wgmma_rs<Tag, VO>(o, a[kk], smem::encode(smem::k_major(v_addr, VO, 0, kk)));
    } else {
      ptx::wgmma_rs<Tag, VO>(o, a[kk], smem::encode(smem::mn_major(v_addr, BN, kk)));
    }
  }
  ptx::wgmma_commit();
}

// After the wait that completes O's wgmma: O and the P it read are the compiler's again.
template <int VO, int kPSteps>
__device__ __forceinline__ void pv_done(float (&o)[VO / 2], uint32_t (&a)[kPSteps][4]) {
  ptx::fence_registers(o);
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) ptx::fence_registers(a[kk]);
}

}  // namespace kvattn::fa3::step
