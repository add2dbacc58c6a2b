// fa2's per-unit attention rules (src/cuda/fa2/kernels/unit_math.h), replayed on the CPU over
// the schedule's work units: every (request, query head, query, key) that DESIGN.md §2 makes
// visible is attended by exactly one unit, and nothing else is, for causal, window, custom
// masks, GQA groups and split-KV chunks. This covers the kernel's tile skipping (the narrowed key
// range) without a GPU.
#include "cuda/fa2/kernels/unit_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/fa2/schedule.h"

namespace kvattn::fa2 {
namespace {

// Blocks that block_fully_visible let skip the mask test, over the whole test (it must find some).
int64_t g_full_blocks = 0;

struct MaskCase {
  bool causal;
  int window_left;
  bool custom;
  bool packed;
};

void check_visibility(const std::vector<int64_t>& qo, const std::vector<int64_t>& kv, int group,
                      int kv_heads, const MaskCase& mc, int64_t chunk, uint32_t seed) {
  Problem prob;
  prob.op = Op::kBatchPrefillRagged;
  prob.batch_size = int(qo.size());
  prob.num_kv_heads = kv_heads;
  prob.num_qo_heads = kv_heads * group;
  RequestStarts starts;
  int64_t row = 0;
  for (size_t b = 0; b < qo.size(); ++b) {
    starts.q_row.push_back(row);
    starts.kv_first.push_back(0);
    row += qo[b];
  }
  const Schedule s = make_schedule(prob, qo, kv, starts, mc.packed, chunk, 132);

  // The custom mask, unpacked (for the expectation) and in the form the kernel reads.
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> bits(qo.size());
  std::vector<uint8_t> mask;
  for (size_t b = 0; b < qo.size(); ++b) {
    ASSERT_EQ(s.requests[b].mask_offset, int64_t(mask.size()));
    const int64_t n = qo[b] * kv[b];
    for (int64_t k = 0; k < n; ++k) bits[b].push_back(uint8_t(rng() % 3 != 0));
    if (mc.packed) {
      std::vector<uint8_t> bytes(size_t((n + 7) / 8), 0);
      for (int64_t k = 0; k < n; ++k)
        bytes[size_t(k / 8)] |= uint8_t(bits[b][size_t(k)] << (k % 8));
      mask.insert(mask.end(), bytes.begin(), bytes.end());
    } else {
      mask.insert(mask.end(), bits[b].begin(), bits[b].end());
    }
  }

  AttentionParams p;
  p.group = group;
  p.num_qo_heads = prob.num_qo_heads;
  p.num_kv_heads = kv_heads;
  p.chunk_size = s.chunk_size;
  p.causal = mc.causal;
  p.window_left = mc.window_left;
  p.custom_mask = mc.custom ? mask.data() : nullptr;
  p.custom_mask_packed = mc.packed;

  // seen[b][h][i][j]
  std::vector<std::vector<int>> seen(qo.size());
  for (size_t b = 0; b < qo.size(); ++b)
    seen[b].assign(size_t(prob.num_qo_heads * qo[b] * kv[b]), 0);
  const int tile_rows = int(s.tile_rows);
  for (const WorkUnit& w : s.work) {
    const RequestInfo& r = s.requests[w.request];
    const split::ChunkRange keys = unit_key_range(p, w, r);
    ASSERT_GE(keys.begin, 0);
    for (int t = 0; t < tile_rows; ++t) {
      const RowInfo ri = row_info(p, w, r, t);
      if (!ri.valid) {
        EXPECT_GE(w.row_begin + t, w.row_end);
        continue;
      }
      // A block the kernel runs without a mask test: this row sees every one of its keys.
      for (int block : {16, 64}) {
        for (int64_t bb = keys.begin; bb < keys.end; bb += block) {
          if (!block_fully_visible(p, w, r, keys, bb, block)) continue;
          if (t == 0) ++g_full_blocks;
          for (int64_t j = bb; j < bb + block; ++j) {
            ASSERT_TRUE(row_sees_key(p, r, ri, keys, j))
                << "block " << bb << " of " << block << " keys is not fully visible: row " << t
                << " key " << j << " causal=" << mc.causal << " window=" << mc.window_left;
          }
        }
      }
      // The kernel visits keys [keys.begin, keys.end) only; a key outside is never attended.
      for (int64_t j = 0; j < r.kv_len; ++j) {
        if (row_sees_key(p, r, ri, keys, j)) {
          EXPECT_TRUE(j >= keys.begin && j < keys.end);
          ++seen[size_t(w.request)][size_t((ri.head * r.qo_len + ri.token) * r.kv_len + j)];
        }
      }
    }
  }
  for (size_t b = 0; b < qo.size(); ++b) {
    for (int h = 0; h < prob.num_qo_heads; ++h) {
      for (int64_t i = 0; i < qo[b]; ++i) {
        const int64_t i_abs = i + kv[b] - qo[b];
        for (int64_t j = 0; j < kv[b]; ++j) {
          bool want = true;
          if (mc.causal && j > i_abs) want = false;
          if (mc.window_left >= 0 && j < i_abs - mc.window_left) want = false;
          if (mc.custom && !bits[b][size_t(i * kv[b] + j)]) want = false;
          ASSERT_EQ(seen[b][size_t((h * qo[b] + i) * kv[b] + j)], want ? 1 : 0)
              << "b=" << b << " h=" << h << " i=" << i << " j=" << j << " causal=" << mc.causal
              << " window=" << mc.window_left << " custom=" << mc.custom << " chunk=" << chunk
              << " group=" << group;
        }
      }
    }
  }
}

TEST(Fa2UnitMathTest, EveryVisibleKeyIsAttendedByExactlyOneUnit) {
  const std::vector<int64_t> qo = {1, 17, 70, 3, 0}, kv = {1, 40, 70, 200, 9};
  const MaskCase masks[] = {{false, -1, false, false}, {true, -1, false, false},
                            {true, 5, false, false},   {false, 12, false, false},
                            {false, -1, true, false},  {true, -1, true, true}};
  uint32_t seed = 1;
  for (const MaskCase& mc : masks) {
    for (int group : {1, 3, 8, 20}) {
      for (int64_t chunk : {int64_t(-1), int64_t(16), int64_t(64)}) {
        check_visibility(qo, kv, group, 2, mc, chunk, seed++);
      }
    }
  }
  // Decode shapes: one query per request, the one-warp tile.
  const std::vector<int64_t> one = {1, 1, 1}, long_kv = {1000, 1, 333};
  for (const MaskCase& mc : masks) check_visibility(one, long_kv, 4, 8, mc, 128, seed++);
  EXPECT_GT(g_full_blocks, 100) << "no block ever ran without the mask test";
}

TEST(Fa2UnitMathTest, TransformedScoreFollowsTheSemantics) {
  AttentionParams p;
  p.score_scale = 0.125f;
  p.soft_cap = 3.0f;
  p.alibi = true;
  p.num_qo_heads = 8;
  RowInfo ri;
  ri.valid = true;
  ri.q_abs = 40;
  ri.head = 2;
  ri.alibi_slope = math::alibi_slope(2, 8);
  const double raw = 50.0, j = 31;
  const double want = 3.0 * std::tanh(raw * 0.125 / 3.0) + std::pow(2.0, -8.0 * 3 / 8) * (j - 40);
  EXPECT_NEAR(transformed_score(p, ri, int64_t(j), float(raw)), want, 1e-5);
  p.soft_cap = 0.0f;
  p.alibi = false;
  EXPECT_FLOAT_EQ(transformed_score(p, ri, 7, 8.0f), 1.0f);
}

}  // namespace
}  // namespace kvattn::fa2
