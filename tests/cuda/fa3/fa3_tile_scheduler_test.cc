// fa3's persistent tile scheduler (src/cuda/fa3/kernels/tile_scheduler.h, tile_order.h) replayed
// on the CPU: every (request, head, query tile) is visited exactly once over the persistent CTAs,
// the order is longest first, every key a row may see lies in its tile's K/V range (causal,
// sliding window), and the blocks the kernel runs without a mask test are fully visible to every
// row of the tile.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/tile_order.h"

namespace kvattn::fa3::sched {
namespace {

bool visible(int64_t qo_len, int64_t kv_len, int64_t i, int64_t j, bool causal, int window) {
  const int64_t offset = kv_len - qo_len;
  return j < kv_len && (!causal || j <= i + offset) && (window < 0 || j >= i + offset - window);
}

struct Batch {
  std::vector<int64_t> qo, kv;
};

Batch random_batch(std::mt19937& rng) {
  Batch b;
  const int n = 1 + int(rng() % 5);
  for (int r = 0; r < n; ++r) {
    const int64_t q = int64_t(rng() % 400);                  // 0 .. 399: below, at, above tiles
    const int64_t extra = rng() % 3 == 0 ? 0 : rng() % 300;  // prefix (cached) keys
    b.qo.push_back(q);
    b.kv.push_back(rng() % 7 == 0 ? int64_t(rng() % 50) : q + extra);  // some kv < qo
  }
  return b;
}

TEST(Fa3TileScheduler, EveryTileOnceOverPersistentCtasLongestFirst) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const Batch b = random_batch(rng);
    const int heads = 1 + int(rng() % 4);
    const bool causal = rng() % 2;
    const int window = rng() % 3 == 0 ? int(rng() % 300) : -1;
    const std::vector<Tile> tiles = ordered_tiles(b.qo, b.kv, heads, causal, window);
    std::map<std::tuple<int, int, int>, int> seen;
    const int ctas = 1 + int(rng() % 9);
    for (int cta = 0; cta < ctas; ++cta) {
      for (int t = first_tile(cta); t < int(tiles.size()); t = next_tile(t, ctas)) {
        ++seen[{tiles[t].request, tiles[t].head, tiles[t].q_tile}];
      }
    }
    int expected = 0;
    for (size_t r = 0; r < b.qo.size(); ++r) {
      for (int h = 0; h < heads; ++h) {
        for (int t = 0; t < ceil_div(b.qo[r], kBlockM); ++t) {
          ++expected;
          EXPECT_EQ((seen[{int(r), h, t}]), 1) << "request " << r << " head " << h << " tile " << t;
        }
      }
    }
    EXPECT_EQ(int(seen.size()), expected);
    for (size_t i = 1; i < tiles.size(); ++i) {
      EXPECT_GE(tiles[i - 1].kv_blocks, tiles[i].kv_blocks) << "not longest first at " << i;
    }
  }
}

TEST(Fa3TileScheduler, CausalLastTilesComeFirst) {
  const std::vector<Tile> tiles = ordered_tiles({1024}, {1024}, 1, true);
  ASSERT_EQ(tiles.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tiles[i].q_tile, 7 - i);
}

TEST(Fa3TileScheduler, KvRangeCoversEveryVisibleKeyAndUnmaskedBlocksNeedNoMask) {
  for (int64_t qo : {1, 63, 64, 127, 128, 129, 255, 256, 300}) {
    for (int64_t kv : {0, 1, 5, 127, 128, 129, 256, 300, 511, 600}) {
      for (bool causal : {false, true}) {
        for (int window : {-1, 0, 9, 127, 128, 200, 1000}) {
          for (int t = 0; t < ceil_div(qo, kBlockM); ++t) {
            const KvRange r = kv_range(qo, kv, t, causal, window);
            ASSERT_LE(r.begin, r.unmasked_begin);
            ASSERT_LE(r.unmasked_begin, r.unmasked_end);
            ASSERT_LE(r.unmasked_end, r.end);
            const int64_t row_end = std::min<int64_t>(qo, int64_t(t + 1) * kBlockM);
            bool first_used = r.blocks() == 0, last_used = r.blocks() == 0;
            for (int64_t i = int64_t(t) * kBlockM; i < row_end; ++i) {
              for (int64_t j = 0; j < kv + kBlockN; ++j) {
                const bool v = visible(qo, kv, i, j, causal, window);
                const int block = int(j / kBlockN);
                if (v) {
                  ASSERT_TRUE(block >= r.begin && block < r.end)
                      << "qo " << qo << " kv " << kv << " window " << window << " row " << i
                      << " key " << j;
                  first_used = first_used || block == r.begin;
                  last_used = last_used || block == r.end - 1;
                }
                if (block < r.end && !r.masked(block)) {
                  ASSERT_TRUE(v) << "unmasked block hides key " << j << " from row " << i << " (qo "
                                 << qo << ", kv " << kv << ", causal " << causal << ", window "
                                 << window << ")";
                }
              }
            }
            // The range is tight: its first and last blocks hold a key some row sees.
            EXPECT_TRUE(first_used && last_used)
                << "qo " << qo << " kv " << kv << " window " << window << " tile " << t;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::fa3::sched
