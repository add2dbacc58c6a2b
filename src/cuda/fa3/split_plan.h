// fa3's split-KV plan, host side: whether a batch's keys are cut into chunks (when its tiles alone
// leave SMs idle: decode of a few long requests), the chunk size in whole K/V blocks, where each
// split request's partial (o, lse) states go, and the rows the merge combines. One function for
// plan() and run() (the plan records the chunk, run() rebuilds the rest from it), replayed with
// the tile list by tests/cuda/fa3/fa3_split_kv_test.cc: every visible key attended once, every
// partial state written once before the merge reads it, every output row written once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/split_kv.h"
#include "cuda/common/merge_row.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/tile_scheduler.h"

namespace kvattn::fa3::split_kv {

// The SMs assumed when the device is only described (an H100 / H200 has 132).
inline constexpr int kAssumedSms = 132;

// A chunk shorter than this costs more in partial-state traffic and the merge than its extra
// CTAs gain (four 128-key blocks).
inline constexpr int64_t kMinChunkKeys = 512;

// One query token of a split request: its partial states merge into its row of out
// (cuda/common/merge_row.h; the merge kernel is fa2's too: cuda/common/split_merge.h).
using MergeRow = cuda::MergeRow;

// Tiles of the unsplit batch: per request, tile heads x row tiles.
inline int64_t unsplit_tiles(const std::vector<int64_t>& qo_len, int num_qo_heads,
                             int rows_per_token) {
  int64_t tiles = 0;
  for (int64_t qo : qo_len) {
    tiles += int64_t(pack::tile_heads(num_qo_heads, rows_per_token)) *
             sched::ceil_div(pack::packed_rows(qo, rows_per_token), sched::kBlockM);
  }
  return tiles;
}

// The chunk in keys, a whole number of `block_n` blocks; 0: no split. requested > 0 forces that
// chunk (rounded up to whole blocks), < 0 forbids a split, 0 splits only when the unsplit tiles
// leave some of `sms` SMs idle and a request is longer than kMinChunkKeys.
inline int64_t choose_chunk_keys(const std::vector<int64_t>& qo_len,
                                 const std::vector<int64_t>& kv_len, int num_qo_heads,
                                 int rows_per_token, int block_n, int sms, int64_t requested) {
  if (requested < 0 || qo_len.empty()) return 0;
  int64_t chunk = requested;
  if (requested == 0) {
    const int64_t tiles = unsplit_tiles(qo_len, num_qo_heads, rows_per_token);
    const int batch = int(qo_len.size());
    chunk = split::choose_chunk_size(kv_len.data(), batch, std::max<int64_t>(1, tiles / batch),
                                     std::max(1, sms), kMinChunkKeys);
    if (chunk == 0) return 0;
  }
  chunk = (chunk + block_n - 1) / block_n * block_n;
  const int64_t longest = *std::max_element(kv_len.begin(), kv_len.end());
  return chunk >= longest ? 0 : chunk;
}

struct SplitPlan {
  int64_t chunk_keys = 0;       // 0: no request is split
  std::vector<int32_t> chunks;  // per request, >= 1
  std::vector<int64_t>
      partial_base;        // per request: state of (token i, chunk c) = base + i*chunks + c
  int64_t num_states = 0;  // partial states of all split requests
  std::vector<MergeRow> merge_rows;  // one per query token of a split request
};

// q_row: each request's first row in q / out (cuda::request_starts).
inline SplitPlan make_split_plan(const std::vector<int64_t>& qo_len,
                                 const std::vector<int64_t>& kv_len,
                                 const std::vector<int64_t>& q_row, int64_t chunk_keys) {
  SplitPlan s;
  s.chunk_keys = chunk_keys;
  s.chunks.resize(qo_len.size());
  s.partial_base.resize(qo_len.size());
  for (size_t b = 0; b < qo_len.size(); ++b) {
    const int64_t chunks = split::num_chunks(kv_len[b], chunk_keys);
    s.chunks[b] = int32_t(chunks);
    s.partial_base[b] = s.num_states;
    if (chunks == 1) continue;
    const split::PartialBlock block{s.num_states, chunks};
    for (int64_t i = 0; i < qo_len[b]; ++i) {
      s.merge_rows.push_back(MergeRow{q_row[b] + i, block.state(i, 0), chunks});
    }
    s.num_states += qo_len[b] * chunks;
  }
  return s;
}

}  // namespace kvattn::fa3::split_kv
