// fa3's decode and split-KV index math replayed on the CPU: the packed GQA rows
// (kernels/packed_rows.h), the tile list with chunks (tile_order.h, tile_scheduler.h's
// tile_kv_range) and the split plan (split_plan.h), walked exactly as the kernel and its merge walk
// them. Over random batches: every (token, query head) is in exactly one row of one tile per
// chunk, reads the KV head of its group, sees every visible key exactly once across its chunks
// and no key outside them; every partial state is written once before the merge reads it, every
// output row is written exactly once (by a tile or by the merge, never both), and the blocks the
// kernel runs without a mask are visible to every packed row.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/split_plan.h"
#include "cuda/fa3/tile_order.h"

namespace kvattn::fa3 {
namespace {

bool visible(int64_t qo_len, int64_t kv_len, int64_t i, int64_t j, bool causal, int window) {
  const int64_t offset = kv_len - qo_len;
  return j >= 0 && j < kv_len && (!causal || j <= i + offset) &&
         (window < 0 || j >= i + offset - window);
}

TEST(Fa3PackedRows, EveryTokenHeadInExactlyOneRowOfItsGroup) {
  for (int group : {1, 2, 3, 4, 8, 16}) {
    for (int kv_heads : {1, 2, 5}) {
      for (int64_t qo : {1, 2, 7, 16, 129}) {
        for (bool packed : {false, true}) {
          const int rpt = pack::rows_per_token(packed, group);
          const int qo_heads = group * kv_heads;
          std::set<std::pair<int64_t, int>> seen;
          for (int th = 0; th < pack::tile_heads(qo_heads, rpt); ++th) {
            for (int64_t row = 0; row < pack::packed_rows(qo, rpt); ++row) {
              const pack::TokenHead t = pack::token_head(row, th, rpt);
              ASSERT_GE(t.token, 0);
              ASSERT_LT(t.token, qo);
              ASSERT_GE(t.qo_head, 0);
              ASSERT_LT(t.qo_head, qo_heads);
              EXPECT_EQ(pack::kv_head(th, rpt, group), t.qo_head / group)
                  << "row " << row << " of tile head " << th << " reads another group's KV head";
              EXPECT_TRUE(seen.insert({t.token, t.qo_head}).second)
                  << "token " << t.token << " head " << t.qo_head << " in two rows";
            }
          }
          EXPECT_EQ(int64_t(seen.size()), qo * qo_heads);
        }
      }
    }
  }
}

TEST(Fa3SplitKv, ChunkChoice) {
  const int n = sched::kBlockN;
  // One long decode request over 8 KV heads on 132 SMs: split, in whole blocks, >= the minimum.
  const int64_t c = split_kv::choose_chunk_keys({1}, {100000}, 64, 8, n, 132, 0);
  EXPECT_GT(c, 0);
  EXPECT_EQ(c % n, 0);
  EXPECT_GE(c, split_kv::kMinChunkKeys);
  EXPECT_GE(split::num_chunks(100000, c) * 8, 100) << "too few CTAs for 132 SMs";
  // Enough tiles already, short requests, forbidden: no split.
  EXPECT_EQ(split_kv::choose_chunk_keys(std::vector<int64_t>(200, 1),
                                        std::vector<int64_t>(200, 9000), 64, 8, n, 132, 0),
            0);
  EXPECT_EQ(split_kv::choose_chunk_keys({1}, {300}, 64, 8, n, 132, 0), 0);
  EXPECT_EQ(split_kv::choose_chunk_keys({1}, {100000}, 64, 8, n, 132, -1), 0);
  // Forced: rounded up to whole blocks; none when it covers the longest request.
  EXPECT_EQ(split_kv::choose_chunk_keys({1}, {1000}, 8, 8, n, 132, 100), 128);
  EXPECT_EQ(split_kv::choose_chunk_keys({1}, {1000}, 8, 8, 64, 132, 100), 128);
  EXPECT_EQ(split_kv::choose_chunk_keys({1}, {1000}, 8, 8, 64, 132, 64), 64);
  EXPECT_EQ(split_kv::choose_chunk_keys({1}, {1000}, 8, 8, n, 132, 1000), 0);
}

struct Batch {
  std::vector<int64_t> qo, kv, q_row;
};

Batch random_batch(std::mt19937& rng, bool decode) {
  Batch b;
  const int n = 1 + int(rng() % 5);
  int64_t row = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t q = decode ? 1 + int64_t(rng() % 2) : int64_t(rng() % 150);
    const int64_t kv = rng() % 6 == 0 ? int64_t(rng() % 20) : q + int64_t(rng() % 700);
    b.qo.push_back(q);
    b.kv.push_back(kv);
    b.q_row.push_back(row);
    row += q;
  }
  return b;
}

TEST(Fa3SplitKv, EveryKeyOnceEveryStateOnceEveryOutputRowOnce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 150; ++trial) {
    const bool decode = rng() % 2;
    const Batch b = random_batch(rng, decode);
    const int kv_heads = 1 + int(rng() % 2);
    const int group = std::vector<int>{1, 2, 5, 8}[rng() % 4];
    const int qo_heads = kv_heads * group;
    const int rpt = pack::rows_per_token(decode, group);
    const int block_n = rng() % 2 ? 128 : 64;
    const bool causal = rng() % 2;
    const int window = rng() % 3 == 0 ? int(rng() % 400) : -1;
    const int64_t requested = rng() % 3 == 0 ? 0 : int64_t(1 + rng() % 700);
    const int sms = 1 + int(rng() % 140);
    const int64_t chunk =
        split_kv::choose_chunk_keys(b.qo, b.kv, qo_heads, rpt, block_n, sms, requested);
    ASSERT_EQ(chunk % block_n, 0);
    const split_kv::SplitPlan sp = split_kv::make_split_plan(b.qo, b.kv, b.q_row, chunk);
    const std::vector<sched::Tile> tiles =
        sched::ordered_tiles(b.qo, b.kv, qo_heads, causal, window, block_n, rpt, chunk);
    const int chunk_blocks = int(chunk / block_n);

    // The kernel's walk: attended keys per (request, token, head, key), flat; writes of outputs
    // and states.
    std::vector<std::vector<uint8_t>> attended(b.qo.size());
    for (size_t r = 0; r < b.qo.size(); ++r) attended[r].assign(b.qo[r] * qo_heads * b.kv[r], 0);
    const auto at = [&](int r, int64_t i, int h, int64_t j) -> uint8_t& {
      return attended[r][(i * qo_heads + h) * b.kv[r] + j];
    };
    std::map<std::pair<int64_t, int>, int> out_writes;    // (out row, head)
    std::map<std::pair<int64_t, int>, int> state_writes;  // (state, head)
    const int ctas = 1 + int(rng() % 9);
    for (int cta = 0; cta < ctas; ++cta) {
      for (int t = sched::first_tile(cta); t < int(tiles.size()); t = sched::next_tile(t, ctas)) {
        const sched::Tile tile = tiles[t];
        const int r = tile.request;
        const int chunks = sp.chunks[r];
        ASSERT_LT(tile.chunk, chunks);
        const sched::KvRange kr = sched::tile_kv_range(tile, b.qo[r], b.kv[r], causal, window,
                                                       block_n, rpt, chunks, chunk_blocks);
        ASSERT_EQ(kr.blocks(), tile.kv_blocks);
        const int64_t rows = pack::packed_rows(b.qo[r], rpt);
        for (int64_t row = int64_t(tile.q_tile) * sched::kBlockM;
             row < std::min(rows, int64_t(tile.q_tile + 1) * sched::kBlockM); ++row) {
          const pack::TokenHead th = pack::token_head(row, tile.head, rpt);
          for (int blk = kr.begin; blk < kr.end; ++blk) {
            for (int64_t j = int64_t(blk) * block_n; j < int64_t(blk + 1) * block_n; ++j) {
              const bool v = visible(b.qo[r], b.kv[r], th.token, j, causal, window);
              if (!kr.masked(blk)) {
                ASSERT_TRUE(v) << "unmasked block " << blk << " hides key " << j << " from row "
                               << row;
              }
              if (v) ++at(r, th.token, th.qo_head, j);
            }
          }
          if (chunks > 1) {
            const int64_t state = sp.partial_base[r] + th.token * chunks + tile.chunk;
            ASSERT_LT(state, sp.num_states);
            ++state_writes[{state, th.qo_head}];
          } else {
            ++out_writes[{b.q_row[r] + th.token, th.qo_head}];
          }
        }
      }
    }
    // The merge runs after every tile: it reads only states the tiles wrote, and writes its rows.
    for (const split_kv::MergeRow& m : sp.merge_rows) {
      for (int h = 0; h < qo_heads; ++h) {
        for (int64_t c = 0; c < m.chunks; ++c) {
          ASSERT_EQ((state_writes[{m.first_state + c, h}]), 1)
              << "merge reads state " << m.first_state + c << " head " << h;
        }
        ++out_writes[{m.out_row, h}];
      }
    }
    int64_t expected_states = 0;
    for (size_t r = 0; r < b.qo.size(); ++r) {
      if (sp.chunks[r] > 1) expected_states += b.qo[r] * sp.chunks[r];
      for (int64_t i = 0; i < b.qo[r]; ++i) {
        for (int h = 0; h < qo_heads; ++h) {
          ASSERT_EQ((out_writes[{b.q_row[r] + i, h}]), 1)
              << "output row " << b.q_row[r] + i << " head " << h << " (chunks " << sp.chunks[r]
              << ")";
          for (int64_t j = 0; j < b.kv[r]; ++j) {
            const int want = visible(b.qo[r], b.kv[r], i, j, causal, window) ? 1 : 0;
            ASSERT_EQ(int(at(int(r), i, h, j)), want)
                << "request " << r << " token " << i << " head " << h << " key " << j << " chunk "
                << chunk << " packed " << decode;
          }
        }
      }
    }
    EXPECT_EQ(sp.num_states, expected_states);
    EXPECT_EQ(int64_t(state_writes.size()), sp.num_states * qo_heads);
    for (const auto& [key, count] : state_writes) EXPECT_EQ(count, 1);
    for (size_t i = 1; i < tiles.size(); ++i) {
      EXPECT_GE(tiles[i - 1].kv_blocks, tiles[i].kv_blocks) << "not longest first at " << i;
    }
  }
}

// A decode step of a GQA group fills group rows of one tile per KV head: 8 heads over 2 KV heads,
// 4 requests -> 8 tiles (not 32), each of one request.
TEST(Fa3SplitKv, DecodePacksTheGroupIntoOneTile) {
  const std::vector<sched::Tile> tiles =
      sched::ordered_tiles({1, 1, 1, 1}, {10, 20, 30, 40}, 8, false, -1, 128, 4, 0);
  EXPECT_EQ(tiles.size(), 8u);
  for (const sched::Tile& t : tiles) {
    EXPECT_EQ(t.q_tile, 0);
    EXPECT_LT(t.head, 2);
  }
}

}  // namespace
}  // namespace kvattn::fa3
