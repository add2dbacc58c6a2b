// fa3's persistent tile scheduler: which (request, head, query tile, KV chunk) each CTA computes,
// in which order, and which K/V blocks a tile visits (split into the fully visible blocks, which
// need no mask test, and the masked edges of the causal diagonal and the sliding window). Plain
// host/device code: the planner builds the ordered tile list with it, the kernel reads the same
// functions, and tests/cuda/fa3/fa3_tile_scheduler_test.cc replays it on the CPU (every tile once,
// longest first, every visible key in range, no mask needed where none is tested).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "cuda/fa3/kernels/tile_size.h"

namespace kvattn::fa3::sched {

// A CTA's query tile rows, the same for every key (tile_size.h's tile_shape), and the K/V block
// the functions below default to (head dims below 256).
inline constexpr int kBlockM = tile_shape(128, 128, 2).block_m;
inline constexpr int kBlockN = tile_shape(128, 128, 2).block_n;

KVATTN_HD int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// One work item: rows [q_tile * kBlockM, +kBlockM) of `request` at `head`, over the K/V blocks of
// split-KV chunk `chunk` (0 when the request is not split). Rows are query tokens at query head
// `head`, or, with the query rows of a GQA group packed (decode; packed_rows.h), (token, head)
// pairs of the group of KV head `head`.
struct Tile {
  int32_t request = 0;
  int32_t head = 0;
  int32_t q_tile = 0;
  int32_t kv_blocks = 0;  // the cost the order uses: K/V blocks this tile visits
  int32_t chunk = 0;
};

// The K/V blocks tile `q_tile` visits: [begin, end), of which [unmasked_begin, unmasked_end) are
// visible to every row of the tile (and hold no key past kv_len), so the loop over them carries
// no mask test; the rest are the masked edges. DESIGN.md §2, with offset = kv_len - qo_len: row i
// sees key j < kv_len iff (not causal or j <= i + offset) and (window_left w < 0 or
// j >= i + offset - w).
struct KvRange {
  int begin = 0;
  int end = 0;
  int unmasked_begin = 0;
  int unmasked_end = 0;
  KVATTN_HD bool masked(int block) const { return block < unmasked_begin || block >= unmasked_end; }
  KVATTN_HD int blocks() const { return end - begin; }
};

KVATTN_HD int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : x > hi ? hi : x;
}

// rows_per_token > 1: the tile's rows are packed (token, head) rows, rows_per_token per token
// (packed_rows.h), and the mask follows the tokens of its first and last rows.
KVATTN_HD KvRange kv_range(int64_t qo_len, int64_t kv_len, int q_tile, bool causal,
                           int window_left = -1, int block_m = kBlockM, int block_n = kBlockN,
                           int rows_per_token = 1) {
  KvRange r;
  const int64_t packed_begin = int64_t(q_tile) * block_m;
  int64_t packed_end = packed_begin + block_m;
  if (packed_end > qo_len * rows_per_token) packed_end = qo_len * rows_per_token;
  if (packed_begin >= packed_end || kv_len <= 0) return r;
  // Tokens from here on (32-bit division: packed_rows.h's kMaxPackedRows).
  const int64_t row_begin = int64_t(uint32_t(packed_begin) / uint32_t(rows_per_token));
  const int64_t offset = kv_len - qo_len;
  const int64_t last_row = int64_t(uint32_t(packed_end - 1) / uint32_t(rows_per_token));
  // Keys some row sees: [first row's lower bound, last row's upper bound].
  const int64_t lo_any =
      window_left >= 0 ? clamp64(row_begin + offset - window_left, 0, kv_len) : 0;
  const int64_t hi_any = causal ? clamp64(last_row + offset + 1, 0, kv_len) : kv_len;
  if (lo_any >= hi_any) return r;
  r.begin = int(lo_any / block_n);
  r.end = ceil_div(hi_any, block_n);
  // Keys every row sees: [last row's lower bound, first row's upper bound]; whole blocks only.
  const int64_t lo_all = window_left >= 0 ? clamp64(last_row + offset - window_left, 0, kv_len) : 0;
  const int64_t hi_all = causal ? clamp64(row_begin + offset + 1, 0, kv_len) : kv_len;
  r.unmasked_begin = ceil_div(lo_all, block_n);
  r.unmasked_end = int(hi_all / block_n);
  if (r.unmasked_begin < r.begin) r.unmasked_begin = r.begin;
  if (r.unmasked_end > r.end) r.unmasked_end = r.end;
  if (r.unmasked_begin > r.unmasked_end) r.unmasked_begin = r.unmasked_end;
  return r;
}

// The blocks of split-KV chunk `chunk` of `chunk_blocks` blocks (chunk_blocks <= 0: no split):
// the range clipped to [chunk * chunk_blocks, (chunk + 1) * chunk_blocks). Chunks are whole
// blocks, so a clipped range needs no mask test the unclipped one did not.
KVATTN_HD KvRange clip_to_chunk(KvRange r, int chunk, int chunk_blocks) {
  if (chunk_blocks <= 0) return r;
  const int lo = chunk * chunk_blocks, hi = lo + chunk_blocks;
  r.begin = int(clamp64(r.begin, lo, hi));
  r.end = int(clamp64(r.end, lo, hi));
  r.unmasked_begin = int(clamp64(r.unmasked_begin, lo, hi));
  r.unmasked_end = int(clamp64(r.unmasked_end, lo, hi));
  if (r.end < r.begin) r.end = r.begin;
  if (r.unmasked_begin > r.unmasked_end) r.unmasked_begin = r.unmasked_end;
  return r;
}

// The blocks `tile` visits: its rows' range (kv_range) within its chunk when its request is split
// into `chunks` > 1 chunks of chunk_blocks blocks. One function for the planner's order, the
// producer and the consumers.
KVATTN_HD KvRange tile_kv_range(const Tile& tile, int64_t qo_len, int64_t kv_len, bool causal,
                                int window_left, int block_n, int rows_per_token, int chunks,
                                int chunk_blocks) {
  return clip_to_chunk(
      kv_range(qo_len, kv_len, tile.q_tile, causal, window_left, kBlockM, block_n, rows_per_token),
      tile.chunk, chunks > 1 ? chunk_blocks : 0);
}

// "Longest first": a tile with more K/V blocks comes before one with fewer; ties keep (request,
// head, q_tile) order so the order is deterministic. Under a causal mask the last query tiles of
// a request are the longest, so they start first and the short ones fill the tail (FA3's LPT
// order), instead of the CTAs that drew the long tiles finishing last.
KVATTN_HD bool runs_before(const Tile& a, const Tile& b) {
  if (a.kv_blocks != b.kv_blocks) return a.kv_blocks > b.kv_blocks;
  if (a.request != b.request) return a.request < b.request;
  if (a.head != b.head) return a.head < b.head;
  if (a.q_tile != b.q_tile) return a.q_tile < b.q_tile;
  return a.chunk < b.chunk;
}

// Persistent CTAs: CTA c of `ctas` takes tiles c, c + ctas, c + 2 ctas, ... of the ordered list,
// so the first wave holds the longest tiles, one each.
KVATTN_HD int first_tile(int cta) { return cta; }
KVATTN_HD int next_tile(int tile, int ctas) { return tile + ctas; }

}  // namespace kvattn::fa3::sched
