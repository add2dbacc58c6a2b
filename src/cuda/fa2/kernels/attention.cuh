// fa2's attention kernel, FlashAttention-2 style: one CTA per work unit (packed query rows of a
// request and KV head, against one KV chunk); warps split the rows, 16 each. Per K/V block:
//   tile loader  - cp.async copies the raw K/V rows (any cache dtype) into a staging buffer while
//                  the previous block computes (two-stage pipeline), then one pass decodes them
//                  to q's 16-bit type (fused RoPE on K here) into swizzled tiles;
//   mainloop     - S = Q K^T with ldmatrix + mma.m16n8k16, score transforms and masks in
//                  registers, online softmax, O += P V with P reused from the S registers;
//   epilogue     - normalize and write o (and lse), or a partial state for the split-KV merge.
// Head dims are compile-time; masks, window, soft cap, ALiBi, RoPE and the o dtype are uniform
// run-time parameters of the same kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/attention_math.h"
#include "core/split_kv.h"
#include "cuda/common/ptx.cuh"
#include "cuda/fa2/kernels/fragment_layout.h"
#include "cuda/fa2/kernels/kv_storage.cuh"
#include "cuda/fa2/kernels/online_softmax.h"
#include "cuda/fa2/kernels/store_out.cuh"
#include "cuda/fa2/kernels/unit_math.h"
#include "cuda/fa2/params.h"

namespace kvattn::fa2 {

template <class QTag_, class KV_, int kDqk_, int kDvo_, int kWarps_>
struct AttentionConfig {
  using QTag = QTag_;
  using KV = KV_;
  using Q16 = cuda::Compute16<QTag>;
  using T = typename Q16::T;
  using Raw = typename KV::Raw;
  static constexpr int kDqk = kDqk_;
  static constexpr int kDvo = kDvo_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = cta_rows(kWarps);
  static constexpr int kKeys = kv_block_keys(kDqk);
  // Shared-memory rows of the swizzled 16-bit tiles (padded, params.h smem_row).
  static constexpr int kDqkRow = smem_row(kDqk);
  static constexpr int kDvoRow = smem_row(kDvo);
  static constexpr int kQBytes = kRows * kDqkRow * 2;
  static constexpr int kKBytes = kKeys * kDqkRow * 2;
  static constexpr int kVBytes = kKeys * kDvoRow * 2;
  static constexpr int kKStageBytes = kKeys * kDqk * int(sizeof(Raw));
  static constexpr int kVStageBytes = kKeys * kDvo * int(sizeof(Raw));
  static constexpr int kSmemBytes = kQBytes + kKBytes + kVBytes + kKStageBytes + kVStageBytes;
  // The swizzle permutes 16-byte chunks within groups of 8, so a tile row is a multiple of 64
  // elements (padded); the MMAs step 16 dims at a time and cp.async copies 16 bytes.
  static_assert(kDqkRow % 64 == 0 && kDvoRow % 64 == 0, "tile rows must be multiples of 64");
  static_assert(kDqk % 16 == 0 && kDvo % 16 == 0, "head dims must be multiples of 16");
  static_assert(kKeys % 16 == 0, "a K/V block is whole MMA k-steps");
  static_assert(kSmemBytes <= 99 * 1024, "shared memory must fit SM86/SM89's 99 KiB per block");
};

template <int D>
__device__ __forceinline__ int swizzled(int row, int col) {
  return frag::swizzled(row, col, D);
}

// Element indices of rotation pair t (or of the plain pair 2t, 2t+1 without RoPE).
__device__ __forceinline__ math::RopePair element_pair(bool rope, int t, int head_dim,
                                                       bool interleave) {
  return rope ? math::rope_pair(t, head_dim, interleave) : math::RopePair{2 * t, 2 * t + 1};
}

// ---- Tile loader ----------------------------------------------------------------------------
template <class C>
__device__ void load_q_tile(const AttentionParams& p, const WorkUnit& w, const RequestInfo& r,
                            typename C::T* q_s) {
  using T = typename C::T;
  constexpr int kPairs = C::kDqk / 2;
  const T* q = static_cast<const T*>(p.q);
  for (int idx = threadIdx.x; idx < C::kRows * kPairs; idx += C::kThreads) {
    const int row = idx / kPairs, t = idx % kPairs;
    const math::RopePair e = element_pair(p.rope, t, C::kDqk, p.rope_interleave);
    const int packed = w.row_begin + row;
    float x1 = 0.0f, x2 = 0.0f;
    if (packed < w.row_end) {
      const int64_t token = packed / p.group;
      const int head = w.kv_head * p.group + packed % p.group;
      const T* src = q + (r.q_row + token) * p.q_stride_row + head * p.q_stride_head;
      x1 = C::Q16::to_float(src[e.first * p.q_stride_dim]);
      x2 = C::Q16::to_float(src[e.second * p.q_stride_dim]);
      if (p.rope) {
        float angle = math::rope_angle(math::query_abs_pos(token, r.qo_len, r.kv_len), t, C::kDqk,
                                       p.rope_theta, p.rope_scale);
        math::Rotated rot = math::rope_rotate(x1, x2, angle);
        x1 = rot.first;
        x2 = rot.second;
      }
    }
    q_s[swizzled<C::kDqkRow>(row, e.first)] = C::Q16::from_float(x1);
    q_s[swizzled<C::kDqkRow>(row, e.second)] = C::Q16::from_float(x2);
  }
}

// Element offset of key j's row (dim 0) for one KV head.
__device__ __forceinline__ int64_t kv_row_offset(const AttentionParams& p,
                                                 const paged::CacheStrides& s, const RequestInfo& r,
                                                 int64_t j, int head) {
  if (p.paged) {
    paged::PageSlot ps = paged::locate_token(p.kv_indices, r.kv_first, j, p.page_size);
    return s.offset(ps.page, ps.slot, head, 0);
  }
  return s.offset(0, r.kv_first + j, head, 0);
}

// Copies the raw rows of keys [block_begin, min(block_begin + kKeys, kv_hi)) into staging, with
// cp.async when the rows allow 16-byte copies (left in flight), else with plain loads. Rows past
// kv_hi are not touched: the decode pass writes zeros for them.
template <class C, int D>
__device__ void copy_raw_rows(const AttentionParams& p, const typename C::Raw* src_base,
                              const paged::CacheStrides& s, const RequestInfo& r, int kv_head,
                              int64_t block_begin, int64_t kv_hi, typename C::Raw* stage) {
  using Raw = typename C::Raw;
  if (p.kv_vector_loads) {
    constexpr int kPerChunk = 16 / int(sizeof(Raw));
    constexpr int kChunks = D / kPerChunk;
    // Consecutive lanes copy consecutive 16-byte chunks of a row (coalesced). When a row's
    // chunks fill whole lane groups (a power-of-two count), the group's first lane finds the
    // row (page lookup: a division and an index load) once and shuffles it to the others,
    // instead of every chunk finding it again (issue 13).
    constexpr bool kShareRow = (kChunks & (kChunks - 1)) == 0 && (C::kKeys * kChunks) % 32 == 0;
    const int lane = threadIdx.x % 32;
    for (int idx = threadIdx.x; idx < C::kKeys * kChunks; idx += C::kThreads) {
      const int n = idx / kChunks, c = idx % kChunks;
      const int64_t j = block_begin + n;
      int64_t row = 0;
      if constexpr (kShareRow) {
        // Lanes of one row: aligned groups of kChunks (or the whole warp for longer rows).
        const int leader = kChunks >= 32 ? 0 : lane & ~(kChunks - 1);
        if (lane == leader && j < kv_hi) row = kv_row_offset(p, s, r, j, kv_head);
        row = __shfl_sync(0xffffffffu, row, leader);
      } else {
        if (j < kv_hi) row = kv_row_offset(p, s, r, j, kv_head);
      }
      if (j < kv_hi)
        cuda::cp_async_16(stage + n * D + c * kPerChunk, src_base + row + c * kPerChunk);
    }
  } else {
    for (int idx = threadIdx.x; idx < C::kKeys * D; idx += C::kThreads) {
      const int n = idx / D, e = idx % D;
      const int64_t j = block_begin + n;
      if (j < kv_hi) stage[n * D + e] = src_base[kv_row_offset(p, s, r, j, kv_head) + e * s.dim];
    }
  }
}

template <class C>
__device__ void issue_kv_block(const AttentionParams& p, const RequestInfo& r, int kv_head,
                               int64_t block_begin, int64_t kv_hi, typename C::Raw* k_stage,
                               typename C::Raw* v_stage) {
  using Raw = typename C::Raw;
  copy_raw_rows<C, C::kDqk>(p, static_cast<const Raw*>(p.k), p.k_strides, r, kv_head, block_begin,
                            kv_hi, k_stage);
  copy_raw_rows<C, C::kDvo>(p, static_cast<const Raw*>(p.v), p.v_strides, r, kv_head, block_begin,
                            kv_hi, v_stage);
  cuda::cp_async_commit();
}

// The dequantization scale of key j of KV head `head` beyond the per-tensor one (folded into the
// score and output scales): per head, per (token, head) from its scale cache, or 1.
__device__ __forceinline__ float granular_scale(const AttentionParams& p, const float* head_scale,
                                                int64_t head_stride, const float* cache,
                                                const paged::CacheStrides& s, const RequestInfo& r,
                                                int64_t j, int head) {
  if (cache) return __ldg(cache + kv_row_offset(p, s, r, j, head));
  if (head_scale) return __ldg(head_scale + head * head_stride);
  return 1.0f;
}

// Staging -> swizzled 16-bit K and V tiles: decode (FP8 or the other 16-bit type) with the
// per-head / per-(token, head) scales, RoPE on K (of the real, dequantized key), zeros past
// kv_hi (so that a masked key's V contributes 0, never 0 * garbage = NaN). Returns whether this
// thread stored a non-finite V element (inf or NaN, after rounding to the tile's type): such a
// block takes guarded_pv instead of the PV MMA, so that keys masked for a row add nothing.
template <class C>
__device__ bool decode_kv_block(const AttentionParams& p, const RequestInfo& r, int kv_head,
                                int64_t block_begin, int64_t kv_hi, const typename C::Raw* k_stage,
                                const typename C::Raw* v_stage, typename C::T* k_s,
                                typename C::T* v_s) {
  using KV = typename C::KV;
  constexpr int kKPairs = C::kDqk / 2;
  for (int idx = threadIdx.x; idx < C::kKeys * kKPairs; idx += C::kThreads) {
    const int n = idx / kKPairs, t = idx % kKPairs;
    const int64_t j = block_begin + n;
    const math::RopePair e = element_pair(p.rope, t, C::kDqk, p.rope_interleave);
    float x1 = 0.0f, x2 = 0.0f;
    if (j < kv_hi) {
      const float ks = granular_scale(p, p.k_head_scale, p.k_head_scale_stride, p.k_scale_cache,
                                      p.ks_strides, r, j, kv_head);
      x1 = KV::to_float(k_stage[n * C::kDqk + e.first]) * ks;
      x2 = KV::to_float(k_stage[n * C::kDqk + e.second]) * ks;
      if (p.rope) {
        math::Rotated rot =
            math::rope_rotate(x1, x2, math::rope_angle(j, t, C::kDqk, p.rope_theta, p.rope_scale));
        x1 = rot.first;
        x2 = rot.second;
      }
    }
    k_s[swizzled<C::kDqkRow>(n, e.first)] = C::Q16::from_float(x1);
    k_s[swizzled<C::kDqkRow>(n, e.second)] = C::Q16::from_float(x2);
  }
  constexpr int kVPairs = C::kDvo / 2;
  bool nonfinite_v = false;
  for (int idx = threadIdx.x; idx < C::kKeys * kVPairs; idx += C::kThreads) {
    const int n = idx / kVPairs, t = idx % kVPairs;
    const int64_t j = block_begin + n;
    const bool in = j < kv_hi;
    const float vs = in ? granular_scale(p, p.v_head_scale, p.v_head_scale_stride, p.v_scale_cache,
                                         p.vs_strides, r, j, kv_head)
                        : 0.0f;
    float x1 = in ? KV::to_float(v_stage[n * C::kDvo + 2 * t]) * vs : 0.0f;
    float x2 = in ? KV::to_float(v_stage[n * C::kDvo + 2 * t + 1]) * vs : 0.0f;
    const typename C::T t1 = C::Q16::from_float(x1), t2 = C::Q16::from_float(x2);
    nonfinite_v |= !isfinite(C::Q16::to_float(t1)) || !isfinite(C::Q16::to_float(t2));
    v_s[swizzled<C::kDvoRow>(n, 2 * t)] = t1;
    v_s[swizzled<C::kDvoRow>(n, 2 * t + 1)] = t2;
  }
  return nonfinite_v;
}

// ---- Mainloop -------------------------------------------------------------------------------
// The per-thread accumulators: o for rows g and g+8 of the warp (c0,c1 -> row g; c2,c3 -> g+8),
// and the online-softmax state of those rows in log2 units (scores are pre-multiplied by log2 e
// so that exp2 does the exponentials). l is this thread's partial row sum; the quad (4 threads
// sharing a row) adds its parts in the epilogue.
template <class C>
struct Accumulators {
  float o[C::kDvo / 8][4];
  float m[2];
  float l[2];
};

template <class C>
__device__ void attend_block(const AttentionParams& p, const RequestInfo& r,
                             const RowInfo (&rows)[2], int64_t block_begin,
                             const split::ChunkRange& keys, const typename C::T* q_s,
                             const typename C::T* k_s, const typename C::T* v_s, bool fully_visible,
                             bool nonfinite_v, Accumulators<C>& acc) {
  constexpr int kNTiles = C::kKeys / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float s[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < C::kDqk / 16; ++ks) {
    uint32_t a[4];
    const frag::RowCol qa = frag::q_ldmatrix(warp, lane, ks);
    cuda::ldmatrix_x4(a, q_s + swizzled<C::kDqkRow>(qa.row, qa.col));
#pragma unroll
    for (int nt2 = 0; nt2 < kNTiles / 2; ++nt2) {
      // b0,b1 of the two 8-key n-tiles 2 nt2 and 2 nt2 + 1 (fragment_layout.h).
      uint32_t b[4];
      const frag::RowCol kb = frag::k_ldmatrix(lane, nt2, ks);
      cuda::ldmatrix_x4(b, k_s + swizzled<C::kDqkRow>(kb.row, kb.col));
      cuda::mma_16816<typename C::QTag>(s[2 * nt2], a, b[0], b[1]);
      cuda::mma_16816<typename C::QTag>(s[2 * nt2 + 1], a, b[2], b[3]);
    }
  }

  // Score transforms in DESIGN.md §2's order (scale, soft cap, ALiBi), then the masks; a block
  // every row fully sees (block_fully_visible: uniform over the CTA) skips the mask test.
  if (fully_visible) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = block_begin + nt * 8 + frag::acc_element(lane, e).col;
        s[nt][e] = transformed_score(p, rows[e >> 1], j, s[nt][e]) * kLog2e;
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const RowInfo& ri = rows[e >> 1];
        const int64_t j = block_begin + nt * 8 + frag::acc_element(lane, e).col;
        s[nt][e] = row_sees_key(p, r, ri, keys, j) ? transformed_score(p, ri, j, s[nt][e]) * kLog2e
                                                   : -INFINITY;
      }
    }
  }

  // Online softmax, one row half at a time (online_softmax.h); the quad shares each row.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float block_max = lane_block_max(s, half);
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
    softmax_block_update(s, acc.o, acc.m[half], acc.l[half], half, block_max);
  }

  if (nonfinite_v) {  // uniform over the CTA (a __syncthreads_or): no divergent shuffles
    guarded_pv<kNTiles, C::kDvo / 8>(
        acc.o, lane,
        [&](int nt, int e, int q) { return __shfl_sync(0xffffffffu, s[nt][e], (lane & ~3) | q); },
        [&](int j, int d) { return C::Q16::to_float(v_s[swizzled<C::kDvoRow>(j, d)]); });
    return;
  }
  // O += P V: the S accumulators of n-tiles 2kk and 2kk+1 are exactly the A fragment of the
  // 16-key k-step kk.
#pragma unroll
  for (int kk = 0; kk < C::kKeys / 16; ++kk) {
    uint32_t a[4] = {C::Q16::pack(s[2 * kk][0], s[2 * kk][1]),
                     C::Q16::pack(s[2 * kk][2], s[2 * kk][3]),
                     C::Q16::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                     C::Q16::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dt2 = 0; dt2 < C::kDvo / 16; ++dt2) {
      // b0,b1 of the two 8-dim tiles 2 dt2 and 2 dt2 + 1 (fragment_layout.h).
      uint32_t b[4];
      const frag::RowCol vb = frag::v_ldmatrix_trans(lane, kk, dt2);
      cuda::ldmatrix_x4_trans(b, v_s + swizzled<C::kDvoRow>(vb.row, vb.col));
      cuda::mma_16816<typename C::QTag>(acc.o[2 * dt2], a, b[0], b[1]);
      cuda::mma_16816<typename C::QTag>(acc.o[2 * dt2 + 1], a, b[2], b[3]);
    }
  }
}

// ---- Epilogue -------------------------------------------------------------------------------
template <class C>
__device__ void store_rows(const AttentionParams& p, const WorkUnit& w, const RequestInfo& r,
                           const RowInfo (&rows)[2], Accumulators<C>& acc) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = acc.l[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const RowInfo& ri = rows[half];
    if (!ri.valid) continue;
    // The sink joins the final state only: a split chunk's partial excludes it (the merge adds
    // it once).
    const RowFinish fin = p.sinks && w.chunk < 0
                              ? finish_row_with_sink(acc.m[half], l, p.v_scale,
                                                     __ldg(p.sinks + ri.head * p.sinks_stride))
                              : finish_row(acc.m[half], l, p.v_scale);
    const float o_scale = fin.o_scale, lse = fin.lse;
    const bool lse_writer = (lane & 3) == 0;
    if (w.chunk < 0) {
      const int64_t row = r.q_row + ri.token;
      const int64_t base = row * p.o_stride_row + ri.head * p.o_stride_head;
#pragma unroll
      for (int dt = 0; dt < C::kDvo / 8; ++dt) {
        const int d = dt * 8 + frag::acc_element(lane, 2 * half).col;
        store_out(p, base + d * p.o_stride_dim, acc.o[dt][2 * half] * o_scale);
        store_out(p, base + (d + 1) * p.o_stride_dim, acc.o[dt][2 * half + 1] * o_scale);
      }
      if (p.lse && lse_writer) p.lse[row * p.lse_stride_row + ri.head * p.lse_stride_head] = lse;
    } else {
      const int64_t state = split::PartialBlock{r.partial_base, r.chunks}.state(ri.token, w.chunk);
      float* po = p.partial_o + (state * p.num_qo_heads + ri.head) * C::kDvo;
#pragma unroll
      for (int dt = 0; dt < C::kDvo / 8; ++dt) {
        const int d = dt * 8 + frag::acc_element(lane, 2 * half).col;
        po[d] = acc.o[dt][2 * half] * o_scale;
        po[d + 1] = acc.o[dt][2 * half + 1] * o_scale;
      }
      if (lse_writer) p.partial_lse[state * p.num_qo_heads + ri.head] = lse;
    }
  }
}

// ---- The kernel -----------------------------------------------------------------------------
template <class C>
__global__ void __launch_bounds__(C::kThreads) attention_kernel(const AttentionParams p) {
  using T = typename C::T;
  using Raw = typename C::Raw;
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = reinterpret_cast<T*>(smem + C::kQBytes);
  T* v_s = reinterpret_cast<T*>(smem + C::kQBytes + C::kKBytes);
  Raw* k_stage = reinterpret_cast<Raw*>(smem + C::kQBytes + C::kKBytes + C::kVBytes);
  Raw* v_stage =
      reinterpret_cast<Raw*>(smem + C::kQBytes + C::kKBytes + C::kVBytes + C::kKStageBytes);

  const WorkUnit w = p.work[blockIdx.x];
  const RequestInfo r = p.requests[w.request];

  const split::ChunkRange keys = unit_key_range(p, w, r);
  const int64_t kv_lo = keys.begin, kv_hi = keys.end;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const RowInfo rows[2] = {row_info(p, w, r, warp * 16 + frag::acc_element(lane, 0).row),
                           row_info(p, w, r, warp * 16 + frag::acc_element(lane, 2).row)};
  Accumulators<C> acc;
#pragma unroll
  for (int dt = 0; dt < C::kDvo / 8; ++dt)
    acc.o[dt][0] = acc.o[dt][1] = acc.o[dt][2] = acc.o[dt][3] = 0.0f;
  acc.m[0] = acc.m[1] = -INFINITY;
  acc.l[0] = acc.l[1] = 0.0f;

  // K/V block 0 is in flight (cp.async) while Q is loaded and converted.
  const int64_t num_blocks = kv_hi > kv_lo ? (kv_hi - kv_lo + C::kKeys - 1) / C::kKeys : 0;
  if (num_blocks > 0) issue_kv_block<C>(p, r, w.kv_head, kv_lo, kv_hi, k_stage, v_stage);
  load_q_tile<C>(p, w, r, q_s);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t block_begin = kv_lo + b * C::kKeys;
    // Staging holds block b; every warp is done with block b-1's tiles (and q_s is written).
    cuda::cp_async_wait_all();
    __syncthreads();
    const bool nonfinite_v = __syncthreads_or(
        decode_kv_block<C>(p, r, w.kv_head, block_begin, kv_hi, k_stage, v_stage, k_s, v_s));
    // The tiles are ready and staging is free: fetch block b+1 while this one computes.
    if (b + 1 < num_blocks) {
      issue_kv_block<C>(p, r, w.kv_head, block_begin + C::kKeys, kv_hi, k_stage, v_stage);
    }
    const bool fully_visible = block_fully_visible(p, w, r, keys, block_begin, C::kKeys);
    attend_block<C>(p, r, rows, block_begin, keys, q_s, k_s, v_s, fully_visible, nonfinite_v, acc);
  }
  store_rows<C>(p, w, r, rows, acc);
}

// What the host needs to launch configuration C: launch.cu sets the shared-memory attribute at
// plan time and launches through fa2's RuntimeCalls at run time (runtime_calls.h).
template <class C>
KernelLaunchInfo kernel_info() {
  return KernelLaunchInfo{reinterpret_cast<const void*>(&attention_kernel<C>), C::kThreads,
                          C::kSmemBytes};
}

// The entry point each generated translation unit instantiates: `warps` picks the decode tile
// (one warp, 16 packed rows) or the prefill tile (four warps, 64 rows).
template <class QTag, class KV, int kDqk, int kDvo>
KernelLaunchInfo attention_kernel_info(int warps) {
  if (warps == kDecodeWarps)
    return kernel_info<AttentionConfig<QTag, KV, kDqk, kDvo, kDecodeWarps>>();
  return kernel_info<AttentionConfig<QTag, KV, kDqk, kDvo, prefill_warps(kDqk)>>();
}

}  // namespace kvattn::fa2
