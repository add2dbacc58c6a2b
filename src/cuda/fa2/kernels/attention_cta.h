// fa2's attention kernel body, FlashAttention-2 style, written once for the GPU and the CPU: a
// host/device template over the thread-level operations of cta_ops.h (DeviceOps on the GPU; the
// CPU emulator of tests/cuda/cta_emulator.h runs this exact code, one std::thread per CUDA
// thread, in tests/cuda/cta_replay_test.cc). One CTA is one work unit: packed query rows of a
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
#include "core/split_kv.h"
#include "cuda/fa2/kernels/formats.h"
#include "cuda/fa2/kernels/fragment_layout.h"
#include "cuda/fa2/kernels/online_softmax.h"
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
  using type = std::conditional_t<QIn::kF16 || (KV::k16 && KV::Format::kF16), F16Format,
                                  Bf16Format>;
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
  static constexpr int kNTiles = kWarpKeys / 8;       // 8-key n-tiles of S per warp
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
  static constexpr int kRopeBytes = kDqk / 2 * 4;  // RoPE inverse frequencies, once per CTA
  static constexpr int bytes_for(int stages) {
    return kQBytes + kRopeBytes + stages * kStageBytes + kConvBytes;
  }
  static constexpr int kMaxSmem = 99 * 1024;  // SM86/SM89's limit per block
  static constexpr int kStages = bytes_for(2) <= kMaxSmem ? 2 : 1;
  // The decode epilogue's (m, l, o) of each key warp, over the (then idle) stages.
  static constexpr int kMergeBytes = kDecode ? kKeyWarps * kWarpRows * (kDvo + 2) * 4 : 0;
  static constexpr int kStageOffset = kQBytes + kRopeBytes;
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
// page size is fixed per launch) and one page-table load.
template <class Ops>
KVATTN_HD int64_t kv_row_offset(const Ops& ops, const AttentionParams& p,
                                const paged::CacheStrides& s, const RequestInfo& r, int64_t j,
                                int head) {
  if (p.paged) {
    const uint32_t page_in_request = p.page_div.div(uint32_t(j));
    const int64_t slot = j - int64_t(page_in_request) * p.page_size;
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

// Aligned 8-byte shared-memory read, and paired global stores (the caller guarantees the
// alignment: p.out_pairs, or f32 partial states at even dims).
KVATTN_HD void load_8_bytes(const unsigned char* p, uint32_t (&w)[2]) {
#if defined(__CUDA_ARCH__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  w[0] = v.x;
  w[1] = v.y;
#else
  std::memcpy(w, p, 8);
#endif
}
KVATTN_HD void store_f32_pair(float* p, float x0, float x1) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float2*>(p) = make_float2(x0, x1);
#else
  const float v[2] = {x0, x1};
  std::memcpy(p, v, 8);
#endif
}
KVATTN_HD void store_u16_pair(uint16_t* p, uint16_t b0, uint16_t b1) {
  const uint32_t v = uint32_t(b0) | (uint32_t(b1) << 16);
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(p, &v, 4);
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
// a row (coalesced); each thread finds a row's page once per block and row.
template <class C, int D, class Ops>
KVATTN_HD void issue_rows(const Ops& ops, const AttentionParams& p, const void* cache,
                          const paged::CacheStrides& s, const RequestInfo& r, int kv_head,
                          int64_t block_begin, int64_t kv_hi, unsigned char* stage) {
  using Raw = typename C::Raw;
  const Raw* src = static_cast<const Raw*>(cache);
  if (p.kv_vector_loads) {
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
      const Raw x = j < kv_hi ? ops.ldg(src + kv_row_offset(ops, p, s, r, j, kv_head) + e * s.dim)
                              : Raw(0);
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
// granular scale: no), and the block's scale source.
struct TileFix {
  bool needed;
  bool rope;
  const float* head_scale;
  int64_t head_stride;
  const float* scale_cache;
  const paged::CacheStrides* scale_strides;
};

// The conversion pass over keys [block_begin, kv_hi) of one block (rows past kv_hi hold zeros):
// step (n, c) takes 16-byte chunk c of row n and its RoPE partner chunk c + D/16 (non-interleaved
// pairs are half a row apart; interleaved pairs sit inside a chunk), decodes 8 elements each
// (FP8: from the raw stage; 16-bit: in place), applies the granular scale and RoPE (angles from
// the CTA's inverse-frequency table), and stores 16 bytes per chunk to the tile. Returns whether
// this thread stored a non-finite element (the V pass flags blocks that need guarded_pv).
template <class C, int D, class Ops>
KVATTN_HD bool fix_tile(const Ops& ops, const AttentionParams& p, const RequestInfo& r,
                        int kv_head, int64_t block_begin, int64_t kv_hi, const TileFix& fix,
                        const unsigned char* stage, uint16_t* tile, const float* inv_freq) {
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
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[h][e] *= sc;
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
        nonfinite |= QFmt::nonfinite(out.e[e]);
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
        const math::Rotated rot = math::rope_rotate(
            x1, x2,
            math::rope_angle(math::query_abs_pos(token, r.qo_len, r.kv_len), t, C::kDqk,
                             p.rope_theta, p.rope_scale));
        x1 = rot.first;
        x2 = rot.second;
      }
    }
    q_s[frag::swizzled(row, e.first, C::kDqkRow)] = QFmt::from_float(x1);
    q_s[frag::swizzled(row, e.second, C::kDqkRow)] = QFmt::from_float(x2);
  }
}

// ---- Mainloop -------------------------------------------------------------------------------
// The per-thread accumulators: o for rows g and g+8 of the warp's 16 (c0,c1 -> row g; c2,c3 ->
// g+8), and the online-softmax state of those rows in log2 units (scores are pre-multiplied by
// log2 e so that exp2 does the exponentials). l is this thread's partial row sum; the quad (4
// threads sharing a row) adds its parts in the epilogue.
template <class C>
struct Accumulators {
  float o[C::kDvo / 8][4];
  float m[2];
  float l[2];
};

// S = Q K^T for this warp's rows (row warp rw) and keys (key warp kw) of the block, the score
// transforms and masks (DESIGN.md §2's order: scale, soft cap, ALiBi, then the masks), and the
// online-softmax update. Leaves the probabilities in s.
template <class C, class Ops>
KVATTN_HD void scores_block(const Ops& ops, const AttentionParams& p, const RequestInfo& r,
                            const RowInfo (&rows)[2], int64_t block_begin,
                            const split::ChunkRange& keys, const uint16_t* q_s,
                            const uint16_t* k_tile, bool fully_visible, float (&s)[C::kNTiles][4],
                            Accumulators<C>& acc) {
  constexpr float kLog2e = 1.4426950408889634f;
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
  const int64_t first_key = block_begin + key0;
  if (fully_visible) {
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
        acc.o, lane,
        [&](int nt, int e, int q) { return ops.shfl(s[nt][e], (lane & ~3) | q); },
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

// ---- Epilogue -------------------------------------------------------------------------------
// Two adjacent output elements (d, d + 1) of a row at element offset `offset` (of d), in the o
// dtype: one 32-bit (16-bit o) or 64-bit (f32 o) store when the launch says pairs are aligned.
KVATTN_HD void store_out_pair(const AttentionParams& p, int64_t offset, float x0, float x1) {
  if (p.out_kind == OutKind::kF32) {
    float* o = static_cast<float*>(p.out) + offset;
    if (p.out_pairs) {
      store_f32_pair(o, x0, x1);
    } else {
      o[0] = x0;
      o[p.o_stride_dim] = x1;
    }
    return;
  }
  const bool f16 = p.out_kind == OutKind::kF16;
  const uint16_t b0 = f16 ? F16Format::from_float(x0) : Bf16Format::from_float(x0);
  const uint16_t b1 = f16 ? F16Format::from_float(x1) : Bf16Format::from_float(x1);
  uint16_t* o = static_cast<uint16_t*>(p.out) + offset;
  if (p.out_pairs) {
    store_u16_pair(o, b0, b1);
  } else {
    o[0] = b0;
    o[p.o_stride_dim] = b1;
  }
}

// The final state of one row (the sink joins it; a split chunk's partial excludes it: the merge
// adds it once).
KVATTN_HD RowFinish finish(const AttentionParams& p, const WorkUnit& w, const RowInfo& ri,
                           float m, float l) {
  return p.sinks && w.chunk < 0
             ? finish_row_with_sink(m, l, p.v_scale, p.sinks[ri.head * p.sinks_stride])
             : finish_row(m, l, p.v_scale);
}

// Writes dims (d, d + 1) of row ri (o already scaled) and, when `lse_writer`, its lse: to out
// and lse, or to the unit's partial state.
KVATTN_HD void write_row_pair(const AttentionParams& p, const WorkUnit& w, const RequestInfo& r,
                              int dvo, const RowInfo& ri, int d, float o0, float o1, float lse,
                              bool lse_writer) {
  if (w.chunk < 0) {
    const int64_t row = r.q_row + ri.token;
    store_out_pair(p, row * p.o_stride_row + ri.head * p.o_stride_head + d * p.o_stride_dim, o0,
                   o1);
    if (p.lse && lse_writer) p.lse[row * p.lse_stride_row + ri.head * p.lse_stride_head] = lse;
  } else {
    const int64_t state = split::PartialBlock{r.partial_base, r.chunks}.state(ri.token, w.chunk);
    store_f32_pair(p.partial_o + (state * p.num_qo_heads + ri.head) * dvo + d, o0, o1);
    if (lse_writer) p.partial_lse[state * p.num_qo_heads + ri.head] = lse;
  }
}

// Prefill tile: each warp owns its rows; the quad adds its row sums and writes its dims.
template <class C, class Ops>
KVATTN_HD void store_rows(const Ops& ops, const AttentionParams& p, const WorkUnit& w,
                          const RequestInfo& r, const RowInfo (&rows)[2], Accumulators<C>& acc) {
  const int lane = ops.thread() % 32;
  KVATTN_UNROLL
  for (int half = 0; half < 2; ++half) {
    float l = acc.l[half];
    l += ops.shfl_xor(l, 1);
    l += ops.shfl_xor(l, 2);
    const RowInfo& ri = rows[half];
    if (!ri.valid) continue;
    const RowFinish fin = finish(p, w, ri, acc.m[half], l);
    KVATTN_UNROLL
    for (int dt = 0; dt < C::kDvo / 8; ++dt) {
      const int d = dt * 8 + frag::acc_element(lane, 2 * half).col;
      write_row_pair(p, w, r, C::kDvo, ri, d, acc.o[dt][2 * half] * fin.o_scale,
                     acc.o[dt][2 * half + 1] * fin.o_scale, fin.lse, (lane & 3) == 0 && dt == 0);
    }
  }
}

// Decode tile: the key warps' states of the same 16 rows merged through shared memory
// (m* = max m_w, l = sum l_w 2^(m_w - m*), o likewise), then every thread finishes and writes
// pairs of dims. A warp that saw no key of a row has m = -inf and weighs 0; a NaN sum stays NaN.
template <class C, class Ops>
KVATTN_HD void merge_store_rows(const Ops& ops, const AttentionParams& p, const WorkUnit& w,
                                const RequestInfo& r, Accumulators<C>& acc, float* merge) {
  const int warp = ops.thread() / 32, lane = ops.thread() % 32;
  float* m_s = merge;                                   // [kKeyWarps][16]
  float* l_s = m_s + C::kKeyWarps * kWarpRows;          // [kKeyWarps][16]
  float* o_s = l_s + C::kKeyWarps * kWarpRows;          // [kKeyWarps][16][kDvo]
  ops.sync();  // every warp is done with the tiles the merge area overlays
  KVATTN_UNROLL
  for (int half = 0; half < 2; ++half) {
    float l = acc.l[half];
    l += ops.shfl_xor(l, 1);
    l += ops.shfl_xor(l, 2);
    const int row = frag::acc_element(lane, 2 * half).row;
    if ((lane & 3) == 0) {
      m_s[warp * kWarpRows + row] = acc.m[half];
      l_s[warp * kWarpRows + row] = l;
    }
    KVATTN_UNROLL
    for (int dt = 0; dt < C::kDvo / 8; ++dt) {
      const int d = dt * 8 + frag::acc_element(lane, 2 * half).col;
      float* o = o_s + (warp * kWarpRows + row) * C::kDvo + d;
      o[0] = acc.o[dt][2 * half];
      o[1] = acc.o[dt][2 * half + 1];
    }
  }
  ops.sync();
  constexpr int kPairs = C::kDvo / 2;
  KVATTN_NO_UNROLL
  for (int idx = ops.thread(); idx < kWarpRows * kPairs; idx += C::kThreads) {
    const int row = idx / kPairs, d = 2 * (idx % kPairs);
    const RowInfo ri = row_info(p, w, r, row);
    if (!ri.valid) continue;
    float m = -INFINITY;
    for (int kw = 0; kw < C::kKeyWarps; ++kw) m = fmaxf(m, m_s[kw * kWarpRows + row]);
    float l = 0.0f, o0 = 0.0f, o1 = 0.0f;
    for (int kw = 0; kw < C::kKeyWarps; ++kw) {
      const float mw = m_s[kw * kWarpRows + row];
      const float f = mw == -INFINITY ? 0.0f : exp2f(mw - m);
      l += l_s[kw * kWarpRows + row] * f;
      o0 += o_s[(kw * kWarpRows + row) * C::kDvo + d] * f;
      o1 += o_s[(kw * kWarpRows + row) * C::kDvo + d + 1] * f;
    }
    const RowFinish fin = finish(p, w, ri, m, l);
    write_row_pair(p, w, r, C::kDvo, ri, d, o0 * fin.o_scale, o1 * fin.o_scale, fin.lse, d == 0);
  }
}

// ---- The CTA --------------------------------------------------------------------------------
// One work unit (`unit`: blockIdx.x on the GPU). smem: C::kSmemBytes, 16-byte aligned.
template <class C, class Ops>
KVATTN_HD void attention_cta(const Ops& ops, const AttentionParams& p, unsigned char* smem,
                             int unit) {
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);
  float* inv_freq = reinterpret_cast<float*>(smem + C::kQBytes);
  unsigned char* stages = smem + C::kStageOffset;
  uint16_t* conv = reinterpret_cast<uint16_t*>(smem + C::kConvOffset);
  auto k_stage = [&](int64_t b) { return stages + int(b % C::kStages) * C::kStageBytes; };
  auto v_stage = [&](int64_t b) { return k_stage(b) + C::kKStageBytes; };
  // The tiles the MMAs read: the stage itself for 16-bit caches, the conversion tile for FP8.
  auto k_tile = [&](int64_t b) {
    return C::k16 ? reinterpret_cast<uint16_t*>(k_stage(b)) : conv;
  };
  auto v_tile = [&](int64_t b) {
    return C::k16 ? reinterpret_cast<uint16_t*>(v_stage(b)) : conv;
  };

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
  const TileFix k_fix{!kSameType || p.rope || k_granular, p.rope, p.k_head_scale,
                      p.k_head_scale_stride, p.k_scale_cache, &p.ks_strides};
  const TileFix v_fix{!kSameType || v_granular, false, p.v_head_scale, p.v_head_scale_stride,
                      p.v_scale_cache, &p.vs_strides};
  constexpr int kPending = C::kStages == 2 ? 2 : 1;

  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t block_begin = kv_lo + b * C::kKeys;
    if constexpr (C::kStages == 2) issue_k(b + 1);
    // K(b) has landed, and every warp is past block b-1's scores (and Q is written).
    ops.template cp_async_wait<kPending>();
    ops.sync();
    if (k_fix.needed) {
      fix_tile<C, C::kDqk>(ops, p, r, w.kv_head, block_begin, kv_hi, k_fix, k_stage(b), k_tile(b),
                           inv_freq);
      ops.sync();
    }
    const bool fully_visible = block_fully_visible(p, w, r, keys, block_begin, C::kKeys);
    float s[C::kNTiles][4];
    scores_block<C>(ops, p, r, rows, block_begin, keys, q_s, k_tile(b), fully_visible, s, acc);
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
    // even with an inf/NaN V: blocks holding such keys learn whether their V is finite.
    bool nonfinite_v = false;
    if (v_fix.needed) {
      nonfinite_v = ops.sync_or(fix_tile<C, C::kDvo>(ops, p, r, w.kv_head, block_begin, kv_hi,
                                                    v_fix, v_stage(b), v_tile(b), inv_freq) &&
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
