// The plain data fa3's attention kernel (prefill and decode) reads: per-request facts, the
// ordered tile list (made by tile_order.h's ordered_tiles), the split-KV partial states
// (split_plan.h) and the kernel parameters. Made on the host by launch.cu; nothing
// here owns memory.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: the driver is reached through the runtime)

#include <cstdint>

#include "core/paged_kv.h"
#include "cuda/common/fast_div.h"
#include "cuda/common/out_kind.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/split_plan.h"

namespace kvattn::fa3 {

// Output element types the epilogue writes (cuda/common/out_kind.h).
using cuda::OutKind;

struct RequestInfo {
  int64_t q_row = 0;  // first row of this request in q / out / lse
  int64_t qo_len = 0;
  int64_t kv_len = 0;
  int64_t kv_first = 0;  // paged: first entry in kv_indices; ragged: first key row; single: 0
  int64_t partial_base =
      0;  // split (chunks > 1): state of (token i, chunk c) = base + i*chunks + c
  int32_t chunks = 1;
};

struct PrefillParams {
  // q [rows, H_qo, D], strides in elements (single decode: row stride 0).
  const void* q = nullptr;
  int64_t q_stride_row = 0, q_stride_head = 0, q_stride_dim = 1;
  // K and V: paged caches, or contiguous [tokens, H_kv, D] (page stride 0, slot = token).
  const void* k = nullptr;
  const void* v = nullptr;
  paged::CacheStrides k_strides, v_strides;
  // Whether every row of q / K / V is a run of 16-byte chunks (dense dim, base and strides
  // multiples of 16 bytes: kernel_params.cc's rows_in_chunks): then 16-byte loads, cp.async and
  // TMA; otherwise the rows are gathered byte by byte (kv_copies.h's gather16).
  bool q_chunks = true, k_chunks = true, v_chunks = true;
  bool paged = false;
  cuda::FastDiv page_div;               // division by the page size (its divisor: the page size)
  const int32_t* kv_indices = nullptr;  // device copy
  // TMA tensor maps over K and V (kernel_params.cc's kv_map_spec: dims innermost first D, H_kv,
  // slots, pages; dense and ragged K/V are one page of all tokens), box 128 bytes x 1 x kBlockN x 1
  // with the 128-byte swizzle: one box is one 128-byte panel of a K/V tile (smem_layout.h; 64
  // 16-bit or 128 FP8 columns). TMA loads 16-bit K and V, FP8 K, and FP8 V into a staging tile
  // that the producer transposes. Set for K/V rows in 16-byte chunks, dense or ragged of fewer than
  // 2^31 tokens or paged with a page size that is a multiple of kBlockN, when the encoder is found;
  // false: the producer copies (cp.async, or gathers rows not in chunks).
  bool tma = false;
  CUtensorMap tma_k{}, tma_v{};

  void* out = nullptr;
  int64_t o_stride_row = 0, o_stride_head = 0, o_stride_dim = 1;
  // Whether every row of out is a run of 16-byte chunks (as q_chunks): then the epilogue stores
  // it 16 bytes at a time (epilogue.h), otherwise element by element.
  bool o_chunks = true;
  OutKind out_kind = OutKind::kBF16;
  float* lse = nullptr;  // may be null
  int64_t lse_stride_row = 0, lse_stride_head = 1;
  float lse_scale = 1.0f;  // the final LSE's base (lse_store_scale); partial states stay natural

  const RequestInfo* requests = nullptr;
  const sched::Tile* tiles = nullptr;  // longest first
  int num_tiles = 0;
  int group = 1;  // H_qo / H_kv
  int num_qo_heads = 1;
  // Decode packs the query rows of a GQA group into one tile (packed_rows.h): rows_per_token =
  // group; prefill: 1.
  int rows_per_token = 1;
  // Consumer warpgroups that compute (tile_size.h's consumer_warpgroups): 1 when no tile of the
  // launch has a row past the first warpgroup's 64 (decode of a GQA group of up to 64 heads, or
  // short prefills): the second warpgroup exits at once instead of computing on padding.
  int consumer_warpgroups = 2;
  // Split-KV (split_plan.h): a split request's tile covers chunk_blocks K/V blocks of its keys and
  // writes its normalized output and LSE (v_scale applied) as a partial state, fp32
  // [state, H_qo, D_vo] and [state, H_qo]; a merge kernel forms out and lse from them.
  int chunk_blocks = 0;
  float* partial_o = nullptr;
  float* partial_lse = nullptr;

  // The score in the log2 domain: s * score_scale_log2, or with a soft cap c
  // (c * log2 e) * tanh(s * score_scale / c), i.e. cap_log2 * tanh(s * score_scale_over_cap).
  float score_scale_log2 = 1.0f;  // sm_scale * q_scale * k_scale * log2(e)
  float soft_cap = 0.0f;          // <= 0: none
  float cap_log2 = 0.0f;
  float score_scale_over_cap = 0.0f;
  float v_scale = 1.0f;  // folded into the output
  bool causal = false;
  int window_left = -1;  // < 0: no sliding window
};

}  // namespace kvattn::fa3
