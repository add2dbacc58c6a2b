// The plain data fa2's attention kernels read: per-request facts, the work units (one CTA each)
// and the kernel parameters. Made on the host by plan.cc's functions, copied to the device by
// launch.cu; nothing here owns memory.
#pragma once

#include <cstdint>

#include "core/paged_kv.h"
#include "cuda/common/fast_div.h"
#include "cuda/common/merge_row.h"
#include "cuda/common/out_kind.h"

namespace kvattn::fa2 {

// Tile sizes, one constexpr source for the planner and the kernels (STYLE.md "One source of
// truth"). A CTA holds kWarpRows query rows per warp; rows are (query token, head of the GQA
// group) pairs packed token-major, so one CTA reads each K/V block once for the whole group.
inline constexpr int kWarpRows = 16;
inline constexpr int kPrefillWarps = 4;
// Keys per K/V block: 64, halved for the 256-wide heads and quartered for the 512-wide ones so
// that shared memory stays under the 99 KiB per block that SM86/SM89 allow.
constexpr int kv_block_keys(int head_dim_qk) {
  return head_dim_qk > 256 ? 16 : head_dim_qk > 128 ? 32 : 64;
}
// The prefill tile's warps: 512-wide heads take two (32 rows), the Q tile alone being 32 KiB.
constexpr int prefill_warps(int head_dim_qk) { return head_dim_qk > 256 ? 2 : kPrefillWarps; }
constexpr int prefill_rows(int head_dim_qk) { return prefill_warps(head_dim_qk) * kWarpRows; }
// The decode tile (issue 13): one 16-row MMA tile (kWarpRows packed rows: a GQA group of one
// token, or a few tokens) whose K/V blocks are split among its warps, 16 keys each: four warps
// on 64-key blocks; one on 16-key blocks for the 512-wide heads (shared memory).
inline constexpr int kDecodeRows = kWarpRows;
constexpr int decode_key_warps(int head_dim_qk) { return head_dim_qk > 256 ? 1 : 4; }
constexpr int decode_block_keys(int head_dim_qk) { return 16 * decode_key_warps(head_dim_qk); }
// Shared-memory row width of a head dim: the swizzle permutes 16-byte chunks within groups of 8,
// so rows are padded to a multiple of 64 elements (96 -> 128; the pad is never read).
constexpr int smem_row(int head_dim) { return (head_dim + 63) / 64 * 64; }

// How to launch one compiled attention kernel (a __global__ taking `const AttentionParams`).
struct KernelLaunchInfo {
  const void* kernel = nullptr;
  int threads = 0;
  int shared_bytes = 0;
};

// Output element types the epilogue writes (cuda/common/out_kind.h).
using cuda::OutKind;

struct RequestInfo {
  int64_t q_row = 0;  // first row of this request in q / out / lse
  int64_t qo_len = 0;
  int64_t kv_len = 0;
  int64_t kv_first = 0;      // paged: first entry in kv_indices; ragged: first key row in k / v
  int64_t mask_offset = 0;   // custom mask: where this request's bits start (bytes)
  int64_t partial_base = 0;  // split: first partial state of this request
  int64_t chunks = 1;        // split: KV chunks (1: this request is not split)
};

// One CTA: packed rows [row_begin, row_end) of a request (row = token * group + head in group)
// against KV chunk `chunk` (-1: all its keys, written straight to out).
struct WorkUnit {
  int32_t request = 0;
  int32_t kv_head = 0;
  int32_t row_begin = 0;
  int32_t row_end = 0;
  int32_t chunk = -1;
  int32_t reserved = 0;
};

// One row of the split-KV merge (the merge kernel is fa3's too: cuda/common/split_merge.h).
using MergeRow = cuda::MergeRow;

struct AttentionParams {
  // q [rows, H_qo, D_qk] (16-bit), strides in elements.
  const void* q = nullptr;
  int64_t q_stride_row = 0, q_stride_head = 0, q_stride_dim = 1;
  // K and V: paged caches, or contiguous [tokens, H_kv, D] (page stride 0, slot = token).
  const void* k = nullptr;
  const void* v = nullptr;
  paged::CacheStrides k_strides, v_strides;
  bool paged = false;
  int page_size = 1;
  const int32_t* kv_indices = nullptr;  // device copy
  cuda::FastDiv page_div;               // division by page_size (a multiply and a shift)
  // True when every K/V row is 16-byte aligned and dense in the dim: cp.async 16-byte copies.
  bool kv_vector_loads = false;

  void* out = nullptr;
  int64_t o_stride_row = 0, o_stride_head = 0, o_stride_dim = 1;
  OutKind out_kind = OutKind::kBF16;
  // True when dims d, d + 1 (d even) of every output row are adjacent and their pair is aligned
  // (o dense in the dim, even row and head strides, an aligned pointer): one paired store.
  bool out_pairs = false;
  float* lse = nullptr;  // may be null
  int64_t lse_stride_row = 0, lse_stride_head = 1;
  float lse_scale = 1.0f;  // the final LSE's base (lse_store_scale); partial states stay natural
  // Split-KV partial states: [states, H_qo, D_vo] and [states, H_qo].
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
  int64_t chunk_size = 0;

  const RequestInfo* requests = nullptr;
  const WorkUnit* work = nullptr;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int group = 1;

  float score_scale = 1.0f;  // sm_scale * k_scale: FP8 K's scale folded into the score
  float v_scale = 1.0f;      // folded into the output
  // kv_scale_granularity per_head: [H_kv] (strided) K and V scales, applied when a block is
  // decoded into the tiles; null: none.
  const float* k_head_scale = nullptr;
  const float* v_head_scale = nullptr;
  int64_t k_head_scale_stride = 1, v_head_scale_stride = 1;
  // per_token_head: scale caches addressed like the rows (strides' dim unused); null: none.
  const float* k_scale_cache = nullptr;
  const float* v_scale_cache = nullptr;
  paged::CacheStrides ks_strides, vs_strides;
  // Attention sinks [H_qo] (strided), joined when the final state is formed; null: none.
  const float* sinks = nullptr;
  int64_t sinks_stride = 1;
  float soft_cap = 0.0f;
  bool causal = false;
  int window_left = -1;
  const uint8_t* custom_mask = nullptr;  // null: no custom mask (contiguous bytes)
  bool custom_mask_packed = false;
  bool alibi = false;
  const float* alibi_slopes = nullptr;  // null with alibi: the standard slopes
  int64_t alibi_stride = 1;
  bool rope = false;
  float rope_theta = 1e4f;
  float rope_scale = 1.0f;
  bool rope_interleave = false;
};

}  // namespace kvattn::fa2
