// fa3's persistent tile scheduler: which (request, query head, query tile) each CTA computes, in
// which order, and which K/V blocks a tile visits (split into the fully visible blocks, which need
// no mask test, and the masked edge). Plain host/device code: the planner builds the ordered tile
// list with it, the kernel reads the same functions, and tests/cuda/fa3_tile_scheduler_test.cc
// replays it on the CPU (every tile once, longest first, every visible key in range, no mask
// needed where none is tested).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::fa3::sched {

// Tile sizes, one source for planner and kernel (STYLE.md "One source of truth"): a CTA's query
// tile is kBlockM rows (two consumer warpgroups of 64 rows, the M of one wgmma each), a K/V
// block is kBlockN keys (the N of the S = Q K^T wgmma).
inline constexpr int kBlockM = 128;
inline constexpr int kBlockN = 128;

KVATTN_HD int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// One work item: query rows [q_tile * kBlockM, +kBlockM) of `request` at query head `head`.
struct Tile {
  int32_t request = 0;
  int32_t head = 0;
  int32_t q_tile = 0;
  int32_t kv_blocks = 0;  // the cost the order uses: K/V blocks this tile visits
};

// The K/V blocks tile `q_tile` visits: [0, end), of which [0, unmasked_end) are visible to every
// row of the tile (and hold no key past kv_len), so the loop over them carries no mask test;
// [unmasked_end, end) are the masked edge. Causal is bottom-right aligned (DESIGN.md §2): row i
// sees key j iff j <= i + (kv_len - qo_len).
struct KvRange {
  int end = 0;
  int unmasked_end = 0;
};

KVATTN_HD KvRange kv_range(int64_t qo_len, int64_t kv_len, int q_tile, bool causal,
                           int block_m = kBlockM, int block_n = kBlockN) {
  KvRange r;
  const int64_t row_begin = int64_t(q_tile) * block_m;
  int64_t row_end = row_begin + block_m;
  if (row_end > qo_len) row_end = qo_len;
  if (row_begin >= row_end || kv_len <= 0) return r;
  const int64_t offset = kv_len - qo_len;
  // Keys visible to some row: [0, last_row + offset + 1) when causal, else [0, kv_len).
  int64_t visible_end = kv_len;
  if (causal) {
    visible_end = row_end - 1 + offset + 1;
    if (visible_end > kv_len) visible_end = kv_len;
    if (visible_end < 0) visible_end = 0;
  }
  r.end = ceil_div(visible_end, block_n);
  // Keys visible to every row: [0, first_row + offset + 1) when causal; whole blocks only, and
  // never a block reaching past kv_len.
  int64_t all_visible = kv_len;
  if (causal) {
    all_visible = row_begin + offset + 1;
    if (all_visible > kv_len) all_visible = kv_len;
    if (all_visible < 0) all_visible = 0;
  }
  r.unmasked_end = int(all_visible / block_n);
  if (r.unmasked_end > r.end) r.unmasked_end = r.end;
  return r;
}

// "Longest first": a tile with more K/V blocks comes before one with fewer; ties keep (request,
// head, q_tile) order so the order is deterministic. Under a causal mask the last query tiles of
// a request are the longest, so they start first and the short ones fill the tail (FA3's LPT
// order), instead of the CTAs that drew the long tiles finishing last.
KVATTN_HD bool runs_before(const Tile& a, const Tile& b) {
  if (a.kv_blocks != b.kv_blocks) return a.kv_blocks > b.kv_blocks;
  if (a.request != b.request) return a.request < b.request;
  if (a.head != b.head) return a.head < b.head;
  return a.q_tile < b.q_tile;
}

// Persistent CTAs: CTA c of `ctas` takes tiles c, c + ctas, c + 2 ctas, ... of the ordered list,
// so the first wave holds the longest tiles, one each.
KVATTN_HD int first_tile(int cta) { return cta; }
KVATTN_HD int next_tile(int tile, int ctas) { return tile + ctas; }

}  // namespace kvattn::fa3::sched
