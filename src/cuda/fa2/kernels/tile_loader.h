// fa2's tile loader, host and device (attention_cta.h documents the pipeline it serves): the
// cp.async copies of a K/V block into a stage (swizzled 16-bit tiles, or raw FP8 rows), the
// conversion pass (FP8 decode, the other 16-bit type, granular scales, RoPE on K) 8 elements per
// step, the non-finite scan of a 16-bit V tile, and the Q tile.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/attention_math.h"
#include "core/hd.h"
#include "cuda/fa2/kernels/fragment_layout.h"
#include "cuda/fa2/kernels/online_softmax.h"
#include "cuda/fa2/params.h"

namespace kvattn::fa2 {

// ---- Small helpers --------------------------------------------------------------------------
KVATTN_HD void sin_cos(float angle, float* s, float* c) {
#if defined(__CUDA_ARCH__)
  sincosf(angle, s, c);
#else
  *s = sinf(angle);
  *c = cosf(angle);
#endif
}

// Element offset of key j's row (dim 0) for one KV head: the page by a fast division (the
// page size is fixed per launch; FastDiv's dividends are 32 bits, so a key past 2^32 - 1 takes
// a 64-bit division: correct, not fast, as fa3's kv_row) and one page-table load.
template <class Ops>
KVATTN_HD int64_t kv_row_offset(const Ops& ops, const AttentionParams& p,
                                const paged::CacheStrides& s, const RequestInfo& r, int64_t j,
                                int head) {
  if (p.paged) {
    const int64_t page_in_request =
        j <= int64_t(UINT32_MAX) ? int64_t(p.page_div.div(uint32_t(j))) : j / p.page_size;
    const int64_t slot = j - page_in_request * p.page_size;
    const int64_t page = ops.ldg(p.kv_indices + r.kv_first + page_in_request);
    return s.offset(page, slot, head, 0);
  }
  return s.offset(0, r.kv_first + j, head, 0);
}

// The dequantization scale of key j of KV head `head` beyond the per-tensor one (folded into the
// score and output scales): per head, per (token, head) from its scale cache, or 1.
template <class Ops>
KVATTN_HD float granular_scale(const Ops& ops, const AttentionParams& p, const float* head_scale,
                               int64_t head_stride, const float* cache,
                               const paged::CacheStrides& s, const RequestInfo& r, int64_t j,
                               int head) {
  if (cache) return ops.ldg(cache + kv_row_offset(ops, p, s, r, j, head));
  if (head_scale) return ops.ldg(head_scale + head * head_stride);
  return 1.0f;
}

// 16 bytes as eight 16-bit elements (shared memory is 16-byte aligned at every chunk).
struct Chunk16 {
  uint16_t e[8];
};
KVATTN_HD Chunk16 load_chunk(const uint16_t* p) {
  Chunk16 c;
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(c.e) = *reinterpret_cast<const uint4*>(p);
#else
  std::memcpy(c.e, p, 16);
#endif
  return c;
}
KVATTN_HD void store_chunk(uint16_t* p, const Chunk16& c) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(c.e);
#else
  std::memcpy(p, c.e, 16);
#endif
}

// Aligned 8-byte shared-memory read.
KVATTN_HD void load_8_bytes(const unsigned char* p, uint32_t (&w)[2]) {
#if defined(__CUDA_ARCH__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  w[0] = v.x;
  w[1] = v.y;
#else
  std::memcpy(w, p, 8);
#endif
}
// ---- Loader ---------------------------------------------------------------------------------
// Byte offset of 16-byte chunk c of key row n in a stage (the swizzled tile for 16-bit caches,
// plain raw rows for FP8).
template <class C, int D>
KVATTN_HD int stage_chunk_offset(int n, int c) {
  if constexpr (C::k16) {
    return 2 * frag::swizzled(n, 8 * c, smem_row(D));
  } else {
    return n * D + 16 * c;
  }
}

// Issues the copies of keys [block_begin, block_begin + kKeys) of one of K or V into a stage:
// cp.async when the rows allow 16-byte copies, zero-filled past kv_hi; else plain loads (rows
// not 16-byte aligned or not dense in the dim). Consecutive threads copy consecutive chunks of
// a row (coalesced).
//
// The copies' addresses were most of the prefill kernel's instructions (the first GPU profile,
// 2026-12-04, H200, ncu's SASS counts: ~1,480 of ~2,400 instructions a warp executed per K/V
// block, against 128 MMAs): each chunk located its row from scratch in 64-bit arithmetic, with a
// branch per row for keys past 2^32 - 1. Now what is the same for every row is worked out once a
// block (the head's base, the rows in range, the page table of the request), a row's key index
// is 32 bits (a paged block with keys past 2^32 - 1, which no cache in memory reaches, takes the
// general path), and a thread looks up the pages of 4 of its rows before it issues their copies,
// so that the page-table loads are in flight together. The prefill tile only: the decode tile
// has no registers to spare (4 rows at once spill it at sm80), and with this path it ran 3-14 %
// slower on the H200 (B=64 x 4k and B=8 x 32k, bf16 and e4m3), so it keeps the row-by-row loop.
template <class C, int D, class Ops>
KVATTN_HD void issue_rows(const Ops& ops, const AttentionParams& p, const void* cache,
                          const paged::CacheStrides& s, const RequestInfo& r, int kv_head,
                          int64_t block_begin, int64_t kv_hi, unsigned char* stage) {
  using Raw = typename C::Raw;
  const Raw* src = static_cast<const Raw*>(cache);
  const bool keys_32_bit = !p.paged || block_begin + C::kKeys <= int64_t(UINT32_MAX);
  if (p.kv_vector_loads && keys_32_bit && !C::kDecode) {
    constexpr int kPerChunk = 16 / int(sizeof(Raw));
    constexpr int kChunks = D / kPerChunk;
    constexpr int kTotal = C::kKeys * kChunks;
    constexpr int kIters = (kTotal + C::kThreads - 1) / C::kThreads;
    constexpr int kBatch = kIters < 4 ? kIters : 4;
    const int rows_in = kv_hi - block_begin < C::kKeys ? int(kv_hi - block_begin) : C::kKeys;
    const Raw* head_base = src + int64_t(kv_head) * s.head;
    // Paged: key j0 + n is slot (j0 + n) % page_size of page table entry (j0 + n) / page_size.
    const uint32_t j0 = uint32_t(block_begin);
    const int32_t* page_table = p.paged ? p.kv_indices + r.kv_first : nullptr;
    const uint32_t page_size = uint32_t(p.page_size);
    // Ragged: row n is row r.kv_first + block_begin + n of the cache.
    const Raw* ragged_rows = p.paged ? head_base : head_base + (r.kv_first + block_begin) * s.slot;
    KVATTN_NO_UNROLL
    for (int i0 = 0; i0 < kIters; i0 += kBatch) {
      int32_t pages[kBatch];
      KVATTN_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        const int idx = ops.thread() + (i0 + i) * C::kThreads, n = idx / kChunks;
        const bool in = i0 + i < kIters && idx < kTotal && n < rows_in;
        pages[i] = p.paged && in ? ops.ldg(page_table + p.page_div.div(j0 + uint32_t(n))) : 0;
      }
      KVATTN_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        const int idx = ops.thread() + (i0 + i) * C::kThreads;
        if (i0 + i >= kIters || idx >= kTotal) break;
        const int n = idx / kChunks, c = idx % kChunks;
        const Raw* row;
        if (p.paged) {
          const uint32_t j = j0 + uint32_t(n);
          const uint32_t slot = j - p.page_div.div(j) * page_size;
          row = head_base + int64_t(pages[i]) * s.page + int64_t(slot) * s.slot;
        } else {
          row = ragged_rows + int64_t(n) * s.slot;
        }
        const bool in = n < rows_in;
        ops.cp_async_16(stage + stage_chunk_offset<C, D>(n, c), in ? row + c * kPerChunk : src, in);
      }
    }
  } else if (p.kv_vector_loads) {  // the decode tile, or keys past 2^32 - 1
    constexpr int kPerChunk = 16 / int(sizeof(Raw));
    constexpr int kChunks = D / kPerChunk;
    KVATTN_NO_UNROLL
    for (int idx = ops.thread(); idx < C::kKeys * kChunks; idx += C::kThreads) {
      const int n = idx / kChunks, c = idx % kChunks;
      const int64_t j = block_begin + n;
      const bool in = j < kv_hi;
      const Raw* row = in ? src + kv_row_offset(ops, p, s, r, j, kv_head) : src;
      ops.cp_async_16(stage + stage_chunk_offset<C, D>(n, c), row + c * kPerChunk, in);
    }
  } else {
    KVATTN_NO_UNROLL
    for (int idx = ops.thread(); idx < C::kKeys * D; idx += C::kThreads) {
      const int n = idx / D, e = idx % D;
      const int64_t j = block_begin + n;
      const Raw x =
          j < kv_hi ? ops.ldg(src + kv_row_offset(ops, p, s, r, j, kv_head) + e * s.dim) : Raw(0);
      if constexpr (C::k16) {
        reinterpret_cast<uint16_t*>(stage)[frag::swizzled(n, e, smem_row(D))] = x;
      } else {
        stage[n * D + e] = x;
      }
    }
  }
}

// How a block's K or V becomes the 16-bit tile the MMAs read, per launch (uniform): whether a
// pass over the tile is needed at all for a 16-bit cache (the same type as Q, no RoPE, no
// granular scale: no), and the block's scale source. K's granular scales go to `key_scale` (one
// f32 per key of the block, shared memory) for the scores, not into the tile: an e4m3 value
// times its scale rounded to bf16 keeps 8 bits, and the LSE showed it (16x past its bound on the
// first GPU run); V's multiply the tile (P is rounded to 16 bits for P V in any case).
struct TileFix {
  bool needed;
  bool rope;
  const float* head_scale;
  int64_t head_stride;
  const float* scale_cache;
  const paged::CacheStrides* scale_strides;
  float* key_scale;
};

// The conversion pass over keys [block_begin, kv_hi) of one block (rows past kv_hi hold zeros):
// step (n, c) takes 16-byte chunk c of row n and its RoPE partner chunk c + D/16 (non-interleaved
// pairs are half a row apart; interleaved pairs sit inside a chunk), decodes 8 elements each
// (FP8: from the raw stage; 16-bit: in place), applies the granular scale and RoPE (angles from
// the CTA's inverse-frequency table), and stores 16 bytes per chunk to the tile. Returns whether
// this thread stored a non-finite element, when asked to check (the V pass of a block with a
// masked key flags a block that needs guarded_pv; no other pass pays for the test).
template <class C, int D, class Ops>
KVATTN_HD bool fix_tile(const Ops& ops, const AttentionParams& p, const RequestInfo& r, int kv_head,
                        int64_t block_begin, int64_t kv_hi, const TileFix& fix,
                        const unsigned char* stage, uint16_t* tile, const float* inv_freq,
                        bool check_nonfinite) {
  using QFmt = typename C::QFmt;
  using KV = typename C::KV;
  constexpr int kRow = smem_row(D);
  constexpr int kHalf = D / 16;  // chunks in half a row
  const int64_t in_rows = kv_hi - block_begin < C::kKeys ? kv_hi - block_begin : C::kKeys;
  // FP8 decodes every row (the zero-filled ones into zeros); a 16-bit pass only the real rows.
  const int rows = C::k16 ? int(in_rows) : C::kKeys;
  bool nonfinite = false;
  KVATTN_NO_UNROLL
  for (int idx = ops.thread(); idx < rows * kHalf; idx += C::kThreads) {
    const int n = idx / kHalf, c = idx % kHalf;
    const int64_t j = block_begin + n;
    const bool in = n < in_rows;
    float x[2][8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int chunk = c + h * kHalf;
      if constexpr (C::k16) {
        const Chunk16 v = load_chunk(tile + frag::swizzled(n, 8 * chunk, kRow));
#pragma unroll
        for (int e = 0; e < 8; ++e) x[h][e] = KV::to_float(v.e[e]);
      } else {
        uint32_t w[2];
        load_8_bytes(stage + n * D + 8 * chunk, w);
        KV::decode8(w[0], w[1], x[h]);
      }
    }
    if (in && (fix.head_scale || fix.scale_cache)) {
      const float sc = granular_scale(ops, p, fix.head_scale, fix.head_stride, fix.scale_cache,
                                      *fix.scale_strides, r, j, kv_head);
      if (fix.key_scale) {
        if (c == 0) fix.key_scale[n] = sc;  // keys past kv_hi are masked: never read
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int e = 0; e < 8; ++e) x[h][e] *= sc;
        }
      }
    }
    if (in && fix.rope) {
      const float pos = float(j) / p.rope_scale;
      if (p.rope_interleave) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            float sn, cs;
            sin_cos(pos * inv_freq[(8 * (c + h * kHalf) + e) / 2], &sn, &cs);
            const float a = x[h][e], b = x[h][e + 1];
            x[h][e] = a * cs - b * sn;
            x[h][e + 1] = b * cs + a * sn;
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float sn, cs;
          sin_cos(pos * inv_freq[8 * c + e], &sn, &cs);
          const float a = x[0][e], b = x[1][e];
          x[0][e] = a * cs - b * sn;
          x[1][e] = b * cs + a * sn;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      Chunk16 out;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        out.e[e] = QFmt::from_float(x[h][e]);
        if (check_nonfinite) nonfinite |= QFmt::nonfinite(out.e[e]);
      }
      store_chunk(tile + frag::swizzled(n, 8 * (c + h * kHalf), kRow), out);
    }
  }
  return nonfinite;
}

// Whether a 16-bit V tile that needs no conversion holds a non-finite element in keys
// [block_begin, kv_hi) (only asked for blocks with a masked key: see attention_cta).
template <class C, class Ops>
KVATTN_HD bool scan_nonfinite(const Ops& ops, int64_t block_begin, int64_t kv_hi,
                              const uint16_t* tile) {
  constexpr int kChunks = C::kDvo / 8;
  const int64_t in_rows = kv_hi - block_begin < C::kKeys ? kv_hi - block_begin : C::kKeys;
  bool nonfinite = false;
  KVATTN_NO_UNROLL
  for (int idx = ops.thread(); idx < int(in_rows) * kChunks; idx += C::kThreads) {
    const int n = idx / kChunks, c = idx % kChunks;
    const Chunk16 v = load_chunk(tile + frag::swizzled(n, 8 * c, C::kDvoRow));
#pragma unroll
    for (int e = 0; e < 8; ++e) nonfinite |= C::QFmt::nonfinite(v.e[e]);
  }
  return nonfinite;
}

// Q rows of the unit into the swizzled Q tile (RoPE applied; zeros for rows past the unit).
// Once per CTA, while K/V block 0 is in flight.
template <class C, class Ops>
KVATTN_HD void load_q_tile(const Ops& ops, const AttentionParams& p, const WorkUnit& w,
                           const RequestInfo& r, uint16_t* q_s) {
  using QFmt = typename C::QFmt;
  constexpr int kPairs = C::kDqk / 2;
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  KVATTN_NO_UNROLL
  for (int idx = ops.thread(); idx < C::kRows * kPairs; idx += C::kThreads) {
    const int row = idx / kPairs, t = idx % kPairs;
    const math::RopePair e =
        p.rope ? math::rope_pair(t, C::kDqk, p.rope_interleave) : math::RopePair{2 * t, 2 * t + 1};
    const int packed = w.row_begin + row;
    float x1 = 0.0f, x2 = 0.0f;
    if (packed < w.row_end) {
      const int64_t token = packed / p.group;
      const int head = w.kv_head * p.group + packed % p.group;
      const uint16_t* src = q + (r.q_row + token) * p.q_stride_row + head * p.q_stride_head;
      x1 = C::QIn::to_float(ops.ldg(src + e.first * p.q_stride_dim));
      x2 = C::QIn::to_float(ops.ldg(src + e.second * p.q_stride_dim));
      if (p.rope) {
        const math::Rotated rot =
            math::rope_rotate(x1, x2,
                              math::rope_angle(math::query_abs_pos(token, r.qo_len, r.kv_len), t,
                                               C::kDqk, p.rope_theta, p.rope_scale));
        x1 = rot.first;
        x2 = rot.second;
      }
    }
    q_s[frag::swizzled(row, e.first, C::kDqkRow)] = QFmt::from_float(x1);
    q_s[frag::swizzled(row, e.second, C::kDqkRow)] = QFmt::from_float(x2);
  }
}

}  // namespace kvattn::fa2
