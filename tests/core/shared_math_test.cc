// The host/device shared math (core/attention_math.h, core/paged_kv.h, core/split_kv.h), used by
// the cpu and CUDA backends alike, tested on the CPU against plain double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/attention_math.h"
#include "core/paged_kv.h"
#include "core/split_kv.h"
#include "kvattn/problem.h"

namespace kvattn {
namespace {

double exact_lse(const std::vector<double>& s) {
  double m = -INFINITY;
  for (double x : s) m = std::max(m, x);
  if (std::isinf(m)) return -INFINITY;
  double sum = 0;
  for (double x : s) sum += std::exp(x - m);
  return m + std::log(sum);
}

TEST(SoftmaxStateTest, OnlineMatchesExactWithRescaledOutput) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> score(-20.0f, 20.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> s, v;
    math::SoftmaxState st;
    double o = 0;  // weighted sum of v with weights relative to st.m
    for (int k = 0; k < 1 + trial; ++k) {
      float x = (k % 5 == 3) ? -INFINITY : score(rng);  // masked scores mixed in
      float val = score(rng);
      s.push_back(x);
      v.push_back(val);
      float rescale = 0;
      float w = st.add(x, &rescale);
      o = o * rescale + w * val;
    }
    double lse = exact_lse(s);
    double want = 0;
    for (size_t k = 0; k < s.size(); ++k) want += std::exp(s[k] - lse) * v[k];
    if (std::isinf(lse)) {
      EXPECT_TRUE(math::is_neg_inf(st.lse()));
      EXPECT_EQ(o * st.inv_sum(), 0.0);
      continue;
    }
    EXPECT_NEAR(st.lse(), lse, 1e-4 * std::max(1.0, std::abs(lse)));
    EXPECT_NEAR(o * st.inv_sum(), want, 1e-4 * 20);
  }
}

TEST(SoftmaxStateTest, EmptyAndAllMaskedStatesGiveZeroOutputAndMinusInf) {
  math::SoftmaxState st;
  EXPECT_TRUE(math::is_neg_inf(st.lse()));
  EXPECT_EQ(st.inv_sum(), 0.0f);
  float rescale = -1;
  EXPECT_EQ(st.add(-INFINITY, &rescale), 0.0f);
  EXPECT_EQ(rescale, 1.0f);
  EXPECT_TRUE(math::is_neg_inf(st.lse()));
  EXPECT_FALSE(std::isnan(st.m));
  EXPECT_FALSE(std::isnan(st.d));
  // A finite score after the empty state: the earlier (empty) output is scaled by 0, not NaN.
  EXPECT_EQ(st.add(3.0f, &rescale), 1.0f);
  EXPECT_EQ(rescale, 0.0f);
  EXPECT_FLOAT_EQ(st.lse(), 3.0f);
}

TEST(MergeWeightsTest, MinusInfinityIsTheIdentity) {
  math::MergeWeights w = math::merge_weights(-INFINITY, 2.5f);
  EXPECT_EQ(w.w_a, 0.0f);
  EXPECT_EQ(w.w_b, 1.0f);
  EXPECT_FLOAT_EQ(w.lse, 2.5f);
  w = math::merge_weights(-1.0f, -INFINITY);
  EXPECT_EQ(w.w_a, 1.0f);
  EXPECT_EQ(w.w_b, 0.0f);
  EXPECT_FLOAT_EQ(w.lse, -1.0f);
  w = math::merge_weights(-INFINITY, -INFINITY);
  EXPECT_EQ(w.w_a, 0.0f);
  EXPECT_EQ(w.w_b, 0.0f);
  EXPECT_TRUE(math::is_neg_inf(w.lse));
}

TEST(MergeWeightsTest, MergeOfTwoHalvesEqualsTheWhole) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> score(-30.0f, 30.0f);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<double> a, b, all, va, vb;
    for (int k = 0; k < 1 + trial % 7; ++k) a.push_back(score(rng)), va.push_back(score(rng));
    for (int k = 0; k < 1 + trial % 5; ++k) b.push_back(score(rng)), vb.push_back(score(rng));
    all = a;
    all.insert(all.end(), b.begin(), b.end());
    double lse_a = exact_lse(a), lse_b = exact_lse(b), lse = exact_lse(all);
    double o_a = 0, o_b = 0, o = 0;
    for (size_t k = 0; k < a.size(); ++k) o_a += std::exp(a[k] - lse_a) * va[k];
    for (size_t k = 0; k < b.size(); ++k) o_b += std::exp(b[k] - lse_b) * vb[k];
    for (size_t k = 0; k < a.size(); ++k) o += std::exp(a[k] - lse) * va[k];
    for (size_t k = 0; k < b.size(); ++k) o += std::exp(b[k] - lse) * vb[k];
    math::MergeWeights w = math::merge_weights(float(lse_a), float(lse_b));
    EXPECT_NEAR(w.lse, lse, 1e-5 * std::max(1.0, std::abs(lse)));
    EXPECT_NEAR(w.w_a * o_a + w.w_b * o_b, o, 1e-4 * 30);
    // The many-state merger agrees with the pairwise weights.
    math::StateMerger m;
    float sa = 0, si = 0;
    double acc = 0;
    m.add(float(lse_a), &sa, &si);
    acc = acc * sa + si * o_a;
    m.add(float(lse_b), &sa, &si);
    acc = acc * sa + si * o_b;
    EXPECT_NEAR(acc * m.inv_sum(), o, 1e-4 * 30);
    EXPECT_NEAR(m.lse(), lse, 1e-5 * std::max(1.0, std::abs(lse)));
  }
}

TEST(StateMergerTest, AllMinusInfinityGivesZeroAndMinusInf) {
  math::StateMerger m;
  float sa = 0, si = 0;
  double acc = 0;
  for (int k = 0; k < 3; ++k) {
    m.add(-INFINITY, &sa, &si);
    acc = acc * sa + si * 5.0;
  }
  EXPECT_EQ(acc * m.inv_sum(), 0.0);
  EXPECT_TRUE(math::is_neg_inf(m.lse()));
}

// Numerics policy (docs/cuda.md): a NaN state poisons the merge wherever it comes (first, between
// finite states, after a larger one), and is never read as an empty (-inf) state.
TEST(StateMergerTest, ANanStatePropagates) {
  const std::vector<std::vector<float>> orders = {
      {NAN, 1.0f, 2.0f}, {1.0f, NAN, 2.0f}, {1.0f, 2.0f, NAN}, {NAN}, {-INFINITY, NAN}};
  for (const std::vector<float>& lses : orders) {
    math::StateMerger m;
    float sa = 0, si = 0;
    float acc = 0;
    for (float lse : lses) {
      m.add(lse, &sa, &si);
      acc = acc * sa + si * 3.0f;
    }
    EXPECT_TRUE(std::isnan(m.lse())) << lses.size() << " states";
    EXPECT_TRUE(std::isnan(acc * m.inv_sum())) << lses.size() << " states";
  }
  // The empty state is still the identity.
  math::StateMerger e;
  EXPECT_EQ(e.inv_sum(), 0.0f);
  EXPECT_TRUE(math::is_neg_inf(e.lse()));
}

TEST(ScoreTransformTest, SoftCap) {
  EXPECT_EQ(math::soft_cap(7.0f, 0.0f), 7.0f);
  EXPECT_EQ(math::soft_cap(7.0f, -1.0f), 7.0f);
  EXPECT_NEAR(math::soft_cap(7.0f, 5.0f), 5.0 * std::tanh(7.0 / 5.0), 1e-6);
  EXPECT_NEAR(math::soft_cap(-1e4f, 30.0f), -30.0, 1e-4);
}

TEST(ScoreTransformTest, AlibiSlopesMatchTheProblemDefinition) {
  for (int heads : {1, 2, 6, 8, 12, 32, 40}) {
    for (int h = 0; h < heads; ++h) {
      EXPECT_NEAR(math::alibi_slope(h, heads), alibi_slope(h, heads), 1e-7)
          << "h=" << h << " of " << heads;
    }
  }
  EXPECT_FLOAT_EQ(math::alibi_slope(0, 8), 0.5f);  // 2^(-8/8)
  EXPECT_FLOAT_EQ(math::alibi_bias(0.5f, 10, 4), -3.0f);
}

TEST(RopeTest, PairsAndAngles) {
  EXPECT_EQ(math::rope_pair(3, 128, false).first, 3);
  EXPECT_EQ(math::rope_pair(3, 128, false).second, 67);
  EXPECT_EQ(math::rope_pair(3, 128, true).first, 6);
  EXPECT_EQ(math::rope_pair(3, 128, true).second, 7);
  for (int e = 0; e < 64; ++e) {
    for (bool inter : {false, true}) {
      int t = math::rope_pair_of(e, 64, inter);
      math::RopePair p = math::rope_pair(t, 64, inter);
      EXPECT_TRUE(p.first == e || p.second == e) << e;
    }
  }
  const double theta = 1e4, scale = 2.0;
  for (int t : {0, 1, 17, 63}) {
    double want = (100.0 / scale) * std::pow(theta, -2.0 * t / 128);
    EXPECT_NEAR(math::rope_angle(100, t, 128, float(theta), float(scale)), want,
                1e-5 * std::max(1.0, want));
  }
  math::Rotated r = math::rope_rotate(1.0f, 2.0f, 0.5f);
  EXPECT_NEAR(r.first, std::cos(0.5) - 2 * std::sin(0.5), 1e-6);
  EXPECT_NEAR(r.second, 2 * std::cos(0.5) + std::sin(0.5), 1e-6);
}

TEST(MaskTest, CausalIsBottomRightAligned) {
  // qo_len 3 over kv_len 5: query 0 sits at 2, sees keys 0..2.
  EXPECT_EQ(math::query_abs_pos(0, 3, 5), 2);
  EXPECT_TRUE(math::causal_visible(2, 2));
  EXPECT_FALSE(math::causal_visible(2, 3));
  math::KeyRange r = math::visible_keys(2, 5, true, -1);
  EXPECT_EQ(r.begin, 0);
  EXPECT_EQ(r.end, 3);
  // More queries than keys: the first queries see nothing.
  r = math::visible_keys(math::query_abs_pos(0, 6, 4), 4, true, -1);
  EXPECT_GE(r.begin, r.end);
}

TEST(MaskTest, VisibleKeysAgreesWithThePredicates) {
  for (int64_t qo = 1; qo <= 6; ++qo) {
    for (int64_t kv = 0; kv <= 9; ++kv) {
      for (int w : {-1, 0, 2, 5}) {
        for (bool causal : {false, true}) {
          for (int64_t i = 0; i < qo; ++i) {
            int64_t pos = math::query_abs_pos(i, qo, kv);
            math::KeyRange r = math::visible_keys(pos, kv, causal, w);
            for (int64_t j = 0; j < kv; ++j) {
              bool want =
                  (!causal || math::causal_visible(pos, j)) && math::window_visible(pos, j, w);
              EXPECT_EQ(j >= r.begin && j < r.end, want)
                  << "qo=" << qo << " kv=" << kv << " w=" << w << " i=" << i << " j=" << j;
            }
          }
        }
      }
    }
  }
}

TEST(MaskTest, CustomMaskPackedAndUnpackedAgree) {
  std::mt19937 rng(11);
  const int64_t qo[2] = {3, 5}, kv[2] = {7, 4};
  std::vector<uint8_t> unpacked, packed;
  int64_t off_u[2], off_p[2];
  for (int b = 0; b < 2; ++b) {
    off_u[b] = int64_t(unpacked.size());
    off_p[b] = int64_t(packed.size());
    int64_t bits = qo[b] * kv[b];
    EXPECT_EQ(math::custom_mask_bytes(qo[b], kv[b], false), bits);
    EXPECT_EQ(math::custom_mask_bytes(qo[b], kv[b], true), (bits + 7) / 8);
    packed.resize(packed.size() + size_t((bits + 7) / 8), 0);
    for (int64_t k = 0; k < bits; ++k) {
      uint8_t bit = rng() & 1;
      unpacked.push_back(bit);
      packed[size_t(off_p[b] + k / 8)] |= uint8_t(bit << (k % 8));
    }
  }
  for (int b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < qo[b]; ++i) {
      for (int64_t j = 0; j < kv[b]; ++j) {
        bool u = math::custom_mask_bit(unpacked.data(), off_u[b], false, i, j, kv[b]);
        EXPECT_EQ(u, unpacked[size_t(off_u[b] + i * kv[b] + j)] != 0);
        EXPECT_EQ(math::custom_mask_bit(packed.data(), off_p[b], true, i, j, kv[b]), u);
      }
    }
  }
}

TEST(PagedKVTest, NhdAndHndOffsetsAddressTheSameElement) {
  const int P = 5, page_size = 4, H = 3, D = 8;
  // A pool filled with a value that encodes (page, slot, head, dim), in both layouts.
  std::vector<int> nhd(P * page_size * H * D), hnd(nhd.size());
  const int64_t nhd_strides[4] = {page_size * H * D, H * D, D, 1};
  const int64_t hnd_strides[4] = {H * page_size * D, page_size * D, D, 1};
  paged::CacheStrides sn = paged::cache_strides(nhd_strides, false);
  paged::CacheStrides sh = paged::cache_strides(hnd_strides, true);
  for (int p = 0; p < P; ++p)
    for (int s = 0; s < page_size; ++s)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          int code = ((p * 16 + s) * 16 + h) * 16 + d;
          nhd[size_t(((p * page_size + s) * H + h) * D + d)] = code;
          hnd[size_t(((p * H + h) * page_size + s) * D + d)] = code;
        }
  // Two requests: pages {3, 0} (len 6) and {4, 1, 2} (len 9).
  const std::vector<int32_t> indptr = {0, 2, 5}, indices = {3, 0, 4, 1, 2}, last = {2, 1};
  EXPECT_EQ(paged::request_kv_len(indptr.data(), last.data(), 0, page_size), 6);
  EXPECT_EQ(paged::request_kv_len(indptr.data(), last.data(), 1, page_size), 9);
  for (int b = 0; b < 2; ++b) {
    int64_t len = paged::request_kv_len(indptr.data(), last.data(), b, page_size);
    for (int64_t j = 0; j < len; ++j) {
      paged::PageSlot ps = paged::locate_token(indices.data(), indptr[b], j, page_size);
      EXPECT_EQ(ps.page, indices[size_t(indptr[b] + j / page_size)]);
      EXPECT_EQ(ps.slot, j % page_size);
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          int code = int(((ps.page * 16 + ps.slot) * 16 + h) * 16 + d);
          EXPECT_EQ(nhd[size_t(sn.offset(ps.page, ps.slot, h, d))], code);
          EXPECT_EQ(hnd[size_t(sh.offset(ps.page, ps.slot, h, d))], code);
          EXPECT_EQ(paged::append_offset(sh, indices.data(), indptr[b], j, page_size, h, d),
                    sh.offset(ps.page, ps.slot, h, d));
        }
    }
  }
  const int32_t no_pages_indptr[2] = {0, 0}, no_last[1] = {0};
  EXPECT_EQ(paged::request_kv_len(no_pages_indptr, no_last, 0, page_size), 0);
}

TEST(SplitKVTest, ChunksCoverTheKeysExactlyOnce) {
  for (int64_t kv : {0, 1, 15, 16, 17, 64, 1000}) {
    for (int64_t chunk : {0, 1, 16, 100, 4096}) {
      int64_t n = split::num_chunks(kv, chunk);
      EXPECT_GE(n, 1);
      int64_t next = 0;
      for (int64_t c = 0; c < n; ++c) {
        split::ChunkRange r = split::chunk_range(kv, chunk, c);
        EXPECT_EQ(r.begin, next);
        EXPECT_GE(r.end, r.begin);
        if (kv > 0) EXPECT_GT(r.end, r.begin) << "kv=" << kv << " chunk=" << chunk;
        if (n > 1) EXPECT_LE(r.end - r.begin, chunk);
        next = r.end;
      }
      EXPECT_EQ(next, kv);
    }
  }
}

TEST(SplitKVTest, PartialStateIndicesAreDistinctAndDense) {
  // Three requests (qo 2, 1, 3) with 3, 1 and 2 chunks.
  const int64_t qo[3] = {2, 1, 3}, chunks[3] = {3, 1, 2};
  std::vector<int> seen(2 * 3 + 1 * 1 + 3 * 2, 0);
  int64_t base = 0;
  for (int b = 0; b < 3; ++b) {
    split::PartialBlock blk{base, chunks[b]};
    for (int64_t i = 0; i < qo[b]; ++i)
      for (int64_t c = 0; c < chunks[b]; ++c) ++seen[size_t(blk.state(i, c))];
    base += qo[b] * chunks[b];
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(SplitKVTest, ChooseChunkSize) {
  const int64_t one_long[1] = {100000};
  int64_t chunk = split::choose_chunk_size(one_long, 1, 8, 264, 256);
  ASSERT_GT(chunk, 0);
  EXPECT_GE(chunk, 256);
  EXPECT_GE(split::num_chunks(100000, chunk) * 8, 264);
  // Enough units already, or too short to split: no split.
  const int64_t many[4] = {5000, 5000, 5000, 5000};
  EXPECT_EQ(split::choose_chunk_size(many, 4, 100, 264, 256), 0);
  const int64_t short_one[1] = {200};
  EXPECT_EQ(split::choose_chunk_size(short_one, 1, 8, 264, 256), 0);
}

}  // namespace
}  // namespace kvattn
