// What one work unit (CTA) of fa2's attention kernel attends to, host and device: its key range
// (the chunk, narrowed by the causal and window masks so fully masked blocks are never loaded),
// the facts about each of its query rows, and whether a row sees a key. Used by the kernel and
// checked on the CPU against DESIGN.md §2's rule (tests/cuda/fa2/unit_math_test.cc).
#pragma once

#include <cstdint>

#include "core/attention_math.h"
#include "core/split_kv.h"
#include "cuda/fa2/params.h"

namespace kvattn::fa2 {

// The keys [begin, end) a unit loads; empty (begin >= end) when nothing is visible.
KVATTN_HD split::ChunkRange unit_key_range(const AttentionParams& p, const WorkUnit& w,
                                           const RequestInfo& r) {
  split::ChunkRange keys = w.chunk < 0 ? split::ChunkRange{0, r.kv_len}
                                       : split::chunk_range(r.kv_len, p.chunk_size, w.chunk);
  // Rows are token-major, so the unit's last row has its latest query and the first its
  // earliest: the causal mask ends at the former, the window starts at the latter.
  if (p.causal) {
    const int64_t last = math::query_abs_pos((w.row_end - 1) / p.group, r.qo_len, r.kv_len);
    if (last + 1 < keys.end) keys.end = last + 1;
  }
  if (p.window_left >= 0) {
    const int64_t first = math::query_abs_pos(w.row_begin / p.group, r.qo_len, r.kv_len);
    if (first - p.window_left > keys.begin) keys.begin = first - p.window_left;
  }
  return keys;
}

// Whether every valid row of unit w sees every key of the block [block_begin, block_begin +
// block_keys): such a block needs no mask test (STYLE.md: hot loops carry no branches they can
// hoist). Never with a custom mask, nor for a block reaching past the unit's key range. Rows are
// token-major: the causal limit is set by the unit's earliest query, the window by its latest.
KVATTN_HD bool block_fully_visible(const AttentionParams& p, const WorkUnit& w,
                                   const RequestInfo& r, const split::ChunkRange& keys,
                                   int64_t block_begin, int block_keys) {
  const int64_t block_end = block_begin + block_keys;
  if (p.custom_mask || block_begin < keys.begin || block_end > keys.end) return false;
  if (p.causal) {
    const int64_t first = math::query_abs_pos(w.row_begin / p.group, r.qo_len, r.kv_len);
    if (!math::causal_visible(first, block_end - 1)) return false;
  }
  if (p.window_left >= 0) {
    const int64_t last = math::query_abs_pos((w.row_end - 1) / p.group, r.qo_len, r.kv_len);
    if (!math::window_visible(last, block_begin, p.window_left)) return false;
  }
  return true;
}

// One packed query row of a unit (tile_row counts from the unit's first row).
struct RowInfo {
  bool valid = false;
  int64_t token = 0;  // query index within the request
  int64_t q_abs = 0;  // absolute position (bottom-right aligned)
  int head = 0;       // query head
  float alibi_slope = 0.0f;
};

KVATTN_HD RowInfo row_info(const AttentionParams& p, const WorkUnit& w, const RequestInfo& r,
                           int tile_row) {
  RowInfo ri;
  const int packed = w.row_begin + tile_row;
  ri.valid = packed < w.row_end;
  if (!ri.valid) return ri;
  ri.token = packed / p.group;
  ri.head = w.kv_head * p.group + packed % p.group;
  ri.q_abs = math::query_abs_pos(ri.token, r.qo_len, r.kv_len);
  if (p.alibi) {
    ri.alibi_slope = p.alibi_slopes ? p.alibi_slopes[ri.head * p.alibi_stride]
                                    : math::alibi_slope(ri.head, p.num_qo_heads);
  }
  return ri;
}

// Whether row `ri` sees key j inside the unit's range `keys` (causal, window, and the custom
// mask unless the kernel is compiled without one: kCustomMask = false).
template <bool kCustomMask = true>
KVATTN_HD bool row_sees_key(const AttentionParams& p, const RequestInfo& r, const RowInfo& ri,
                            const split::ChunkRange& keys, int64_t j) {
  bool visible = ri.valid && j >= keys.begin && j < keys.end &&
                 (!p.causal || math::causal_visible(ri.q_abs, j)) &&
                 math::window_visible(ri.q_abs, j, p.window_left);
  if constexpr (kCustomMask) {
    if (visible && p.custom_mask) {
      visible = math::custom_mask_bit(p.custom_mask, r.mask_offset, p.custom_mask_packed,
                                      ri.token, j, r.kv_len);
    }
  }
  return visible;
}

// The score after DESIGN.md §2's transforms (scale, soft cap, ALiBi), before masking.
KVATTN_HD float transformed_score(const AttentionParams& p, const RowInfo& ri, int64_t j,
                                  float raw_dot) {
  float x = math::soft_cap(raw_dot * p.score_scale, p.soft_cap);
  if (p.alibi) x += math::alibi_bias(ri.alibi_slope, ri.q_abs, j);
  return x;
}

}  // namespace kvattn::fa2
