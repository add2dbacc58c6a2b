// The planner's side of fa3's tile scheduler (kernels/tile_scheduler.h): the ordered tile list of
// a batch, longest first. Host only; the kernel walks the list this returns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/fa3/kernels/tile_scheduler.h"

namespace kvattn::fa3::sched {

// Every (request, query head, query tile) once, in runs_before order. qo_len / kv_len per request.
inline std::vector<Tile> ordered_tiles(const std::vector<int64_t>& qo_len,
                                       const std::vector<int64_t>& kv_len, int num_qo_heads,
                                       bool causal, int window_left = -1, int block_n = kBlockN) {
  std::vector<Tile> tiles;
  for (size_t r = 0; r < qo_len.size(); ++r) {
    const int q_tiles = ceil_div(qo_len[r], kBlockM);
    for (int h = 0; h < num_qo_heads; ++h) {
      for (int t = 0; t < q_tiles; ++t) {
        tiles.push_back(Tile{
            int32_t(r), h, t,
            kv_range(qo_len[r], kv_len[r], t, causal, window_left, kBlockM, block_n).blocks()});
      }
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), runs_before);
  return tiles;
}

}  // namespace kvattn::fa3::sched
