// fa2's schedule (src/cuda/fa2/schedule.*): every (request, query head, query token) is covered
// by exactly one work unit per KV chunk, the chunks cover the keys, the partial states and merge
// rows line up. Runs on the CPU.
#include "cuda/fa2/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <tuple>

#include "core/split_kv.h"
#include "cuda/fa2/kernels/unit_math.h"

namespace kvattn::fa2 {
namespace {

Problem prefill(int qo_heads, int kv_heads) {
  Problem p;
  p.op = Op::kBatchPrefillPaged;
  p.num_qo_heads = qo_heads;
  p.num_kv_heads = kv_heads;
  return p;
}

RequestStarts starts_for(const std::vector<int64_t>& qo_len) {
  RequestStarts s;
  int64_t row = 0;
  for (int64_t q : qo_len) {
    s.q_row.push_back(row);
    s.kv_first.push_back(0);
    row += q;
  }
  return s;
}

void check_coverage(const Problem& p, const std::vector<int64_t>& qo_len,
                    const std::vector<int64_t>& kv_len, const Schedule& s) {
  const int group = p.group_size();
  const int64_t tile = s.tile_rows;
  // (request, qo head, token, chunk) -> times covered
  std::map<std::tuple<int, int, int64_t, int64_t>, int> covered;
  for (const WorkUnit& w : s.work) {
    ASSERT_LT(w.row_begin, w.row_end);
    ASSERT_LE(w.row_end - w.row_begin, tile);
    const RequestInfo& r = s.requests[w.request];
    ASSERT_LE(w.row_end, r.qo_len * group);
    for (int row = w.row_begin; row < w.row_end; ++row) {
      ++covered[{w.request, w.kv_head * group + row % group, row / group, w.chunk}];
    }
  }
  int64_t states = 0;
  for (int b = 0; b < p.batch_size; ++b) {
    const RequestInfo& r = s.requests[b];
    EXPECT_EQ(r.chunks, split::num_chunks(kv_len[b], s.chunk_size));
    for (int h = 0; h < p.num_qo_heads; ++h) {
      for (int64_t i = 0; i < qo_len[b]; ++i) {
        for (int64_t c = 0; c < r.chunks; ++c) {
          EXPECT_EQ((covered[{b, h, i, r.chunks > 1 ? c : -1}]), 1)
              << "b=" << b << " h=" << h << " i=" << i << " c=" << c;
        }
      }
    }
    if (r.chunks > 1) {
      EXPECT_EQ(r.partial_base, states);
      states += qo_len[b] * r.chunks;
    }
  }
  EXPECT_EQ(s.num_partial_states, states);
  int64_t merge_rows = 0;
  for (int b = 0; b < p.batch_size; ++b) {
    if (s.requests[b].chunks > 1) merge_rows += qo_len[b];
  }
  EXPECT_EQ(int64_t(s.merge_rows.size()), merge_rows);
  for (const MergeRow& m : s.merge_rows) EXPECT_GT(m.chunks, 1);
}

TEST(Fa2ScheduleTest, PrefillRowsAndHeadsAreCoveredOnce) {
  for (int kv_heads : {1, 2, 4}) {
    for (int group : {1, 3, 8, 32, 80}) {
      Problem p = prefill(kv_heads * group, kv_heads);
      p.batch_size = 4;
      const std::vector<int64_t> qo = {1, 17, 0, 100}, kv = {5, 17, 3, 400};
      Schedule s = make_schedule(p, qo, kv, starts_for(qo), false, -1, 132);
      EXPECT_EQ(s.chunk_size, 0);
      check_coverage(p, qo, kv, s);
    }
  }
}

// Issue 13: CTAs start in grid order, so the costliest units (most keys loaded, by the kernel's
// own unit_key_range) come first; the set of units is unchanged.
TEST(Fa2ScheduleTest, CausalPrefillUnitsAreOrderedCostliestFirst) {
  for (int window : {-1, 300}) {
    Problem p = prefill(8, 2);
    p.batch_size = 3;
    p.mask_mode = MaskMode::kCausal;
    p.window_left = window;
    const std::vector<int64_t> qo = {500, 40, 130}, kv = {900, 40, 2000};
    for (int64_t chunk : {int64_t(-1), int64_t(512)}) {
      Schedule s = make_schedule(p, qo, kv, starts_for(qo), false, chunk, 132);
      check_coverage(p, qo, kv, s);
      AttentionParams params;
      params.causal = true;
      params.window_left = window;
      params.group = p.group_size();
      params.chunk_size = s.chunk_size;
      int64_t previous = INT64_MAX, first = -1, last = -1;
      for (const WorkUnit& w : s.work) {
        const split::ChunkRange k = unit_key_range(params, w, s.requests[w.request]);
        const int64_t keys = std::max<int64_t>(0, k.end - k.begin);
        EXPECT_LE(keys, previous) << "window " << window << " chunk " << chunk;
        previous = keys;
        if (first < 0) first = keys;
        last = keys;
      }
      EXPECT_GT(first, last) << "the case must have units of different costs";
    }
  }
}

// Without a mask the cost is the request's keys (or its chunk's): the longest requests go first,
// and units of equal cost keep the order they were made in (request, KV head, rows, chunk), so
// the schedule is deterministic.
TEST(Fa2ScheduleTest, UnmaskedUnitsAreOrderedByKeysThenAsMade) {
  Problem p;
  p.op = Op::kBatchDecode;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.batch_size = 5;
  const std::vector<int64_t> qo = {1, 1, 1, 1, 1}, kv = {100, 5000, 0, 2000, 5000};
  for (int64_t chunk : {int64_t(-1), int64_t(1024)}) {
    Schedule s = make_schedule(p, qo, kv, starts_for(qo), false, chunk, 132);
    check_coverage(p, qo, kv, s);
    const auto keys = [&](const WorkUnit& w) {
      const RequestInfo& r = s.requests[w.request];
      const split::ChunkRange k = w.chunk < 0 ? split::ChunkRange{0, r.kv_len}
                                              : split::chunk_range(r.kv_len, s.chunk_size, w.chunk);
      return k.end - k.begin;
    };
    const auto made = [](const WorkUnit& w) {
      return std::make_tuple(w.request, w.kv_head, w.row_begin, w.chunk);
    };
    ASSERT_FALSE(s.work.empty());
    EXPECT_EQ(keys(s.work.front()), chunk < 0 ? 5000 : 1024);
    EXPECT_EQ(keys(s.work.back()), 0);
    for (size_t i = 1; i < s.work.size(); ++i) {
      const WorkUnit &a = s.work[i - 1], &b = s.work[i];
      EXPECT_GE(keys(a), keys(b)) << "unit " << i << " chunk " << chunk;
      if (keys(a) == keys(b)) EXPECT_LT(made(a), made(b)) << "unit " << i << " chunk " << chunk;
    }
  }
}

TEST(Fa2ScheduleTest, ForcedSplitCoversEveryChunk) {
  Problem p = prefill(8, 2);
  p.batch_size = 3;
  const std::vector<int64_t> qo = {3, 1, 2}, kv = {1000, 10, 0};
  Schedule s = make_schedule(p, qo, kv, starts_for(qo), false, 256, 132);
  EXPECT_EQ(s.chunk_size, 256);
  EXPECT_EQ(s.requests[0].chunks, 4);
  EXPECT_EQ(s.requests[1].chunks, 1);
  EXPECT_EQ(s.requests[2].chunks, 1);  // no keys: one empty chunk, o = 0 and lse = -inf
  check_coverage(p, qo, kv, s);
  // The public description agrees with the units.
  std::vector<WorkItem> items = describe(s, p.group_size());
  ASSERT_EQ(items.size(), s.work.size());
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(items[i].partial, s.work[i].chunk);
    if (items[i].partial >= 0) EXPECT_EQ(items[i].kv_end - items[i].kv_begin <= 256, true);
  }
}

TEST(Fa2ScheduleTest, DecodeUsesTheSmallTileAndSplitsLongContexts) {
  Problem p;
  p.op = Op::kBatchDecode;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.batch_size = 1;
  const std::vector<int64_t> qo = {1}, kv = {32768};
  Schedule s = make_schedule(p, qo, kv, starts_for(qo), false, 0, 132);
  EXPECT_TRUE(s.decode_tile);
  EXPECT_EQ(s.tile_rows, kDecodeRows);
  EXPECT_GT(s.chunk_size, 0);
  EXPECT_GE(int64_t(s.work.size()), 2 * 132);
  check_coverage(p, qo, kv, s);
  // A batch that fills the GPU by itself is not split.
  p.batch_size = 64;
  std::vector<int64_t> qo64(64, 1), kv64(64, 4096);
  s = make_schedule(p, qo64, kv64, starts_for(qo64), false, 0, 132);
  EXPECT_EQ(s.chunk_size, 0);
  EXPECT_TRUE(s.merge_rows.empty());
}

// Issue 11: head dim 512 takes the two-warp prefill tile (32 rows), the one the kernel is
// instantiated with, and its rows are still covered exactly once.
TEST(Fa2ScheduleTest, HeadDim512UsesTheTwoWarpPrefillTile) {
  Problem p;
  p.op = Op::kBatchPrefillPaged;
  p.num_qo_heads = 16;
  p.num_kv_heads = 2;
  p.head_dim_qk = p.head_dim_vo = 512;
  p.batch_size = 2;
  const std::vector<int64_t> qo = {40, 3}, kv = {100, 7};
  Schedule s = make_schedule(p, qo, kv, starts_for(qo), false, -1, 132);
  EXPECT_FALSE(s.decode_tile);
  EXPECT_EQ(s.tile_rows, prefill_rows(512));
  EXPECT_EQ(prefill_warps(512), 2);
  EXPECT_EQ(prefill_warps(256), kPrefillWarps);
  EXPECT_EQ(kv_block_keys(512), 16);
  check_coverage(p, qo, kv, s);
}

TEST(Fa2ScheduleTest, CustomMaskOffsetsFollowTheRequests) {
  Problem p = prefill(4, 4);
  p.batch_size = 3;
  const std::vector<int64_t> qo = {3, 2, 5}, kv = {5, 9, 7};
  Schedule unpacked = make_schedule(p, qo, kv, starts_for(qo), false, -1, 132);
  Schedule packed = make_schedule(p, qo, kv, starts_for(qo), true, -1, 132);
  EXPECT_EQ(unpacked.requests[1].mask_offset, 15);
  EXPECT_EQ(unpacked.requests[2].mask_offset, 15 + 18);
  EXPECT_EQ(packed.requests[1].mask_offset, 2);      // 15 bits -> 2 bytes
  EXPECT_EQ(packed.requests[2].mask_offset, 2 + 3);  // 18 bits -> 3 bytes
}

}  // namespace
}  // namespace kvattn::fa2
