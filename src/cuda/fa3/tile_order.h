// The planner's side of fa3's tile scheduler (kernels/tile_scheduler.h): the ordered tile list of
// a batch, longest first. Host only; the kernel walks the list this returns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/split_kv.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/tile_scheduler.h"

namespace kvattn::fa3::sched {

// Every (request, tile head, row tile, chunk) once, in runs_before order. qo_len / kv_len per
// request. rows_per_token > 1 packs the query rows of a GQA group (packed_rows.h: tile heads are
// then KV heads); chunk_keys > 0 (a multiple of block_n) cuts longer requests into split-KV
// chunks (split_plan.h). A tile with no visible key is listed too: it writes o = 0, lse = -inf.
inline std::vector<Tile> ordered_tiles(const std::vector<int64_t>& qo_len,
                                       const std::vector<int64_t>& kv_len, int num_qo_heads,
                                       bool causal, int window_left = -1, int block_n = kBlockN,
                                       int rows_per_token = 1, int64_t chunk_keys = 0) {
  std::vector<Tile> tiles;
  const int heads = pack::tile_heads(num_qo_heads, rows_per_token);
  const int chunk_blocks = int(chunk_keys / block_n);
  for (size_t r = 0; r < qo_len.size(); ++r) {
    const int q_tiles = ceil_div(pack::packed_rows(qo_len[r], rows_per_token), kBlockM);
    const int chunks = int(split::num_chunks(kv_len[r], chunk_keys));
    for (int h = 0; h < heads; ++h) {
      for (int t = 0; t < q_tiles; ++t) {
        for (int c = 0; c < chunks; ++c) {
          Tile tile{int32_t(r), h, t, 0, c};
          tile.kv_blocks = tile_kv_range(tile, qo_len[r], kv_len[r], causal, window_left, block_n,
                                         rows_per_token, chunks, chunk_blocks)
                               .blocks();
          tiles.push_back(tile);
        }
      }
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), runs_before);
  return tiles;
}

}  // namespace kvattn::fa3::sched
