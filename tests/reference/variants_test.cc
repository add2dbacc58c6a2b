// Hand-computed cases for the variants of issue 11 (DESIGN.md §2): attention sinks, FP8 K/V
// scales per head and per (token, head), and head dim 96 through every operation. Each expected
// value is worked out here from the rule itself.
#include <cmath>

#include "reference/ref_test_util.h"

namespace kvattn::reftest {
namespace {

constexpr double kTol = 1e-6;  // f32 outputs of fp64 math: only the final rounding to f32

TEST(ReferenceSinks, RowWithNoVisibleKeyGivesZeroAndTheSinkAsLse) {
  // Causal, 3 queries over 1 key: query 0 and 1 see nothing (j <= i - 2), query 2 sees key 0.
  Dense t(3, 1, 2, 1, 1, 1);
  t.p.mask_mode = MaskMode::kCausal;
  t.p.use_sinks = true;
  t.sinks = {0.75f, -1.5f};
  t.p.sm_scale = 1.0f;
  for (int i = 0; i < 3; ++i) t.q_at(i, 0, 0) = t.q_at(i, 1, 0) = 2.0f;
  t.k = {1.5f};  // s = 3
  t.v = {4.0f};
  t.run();
  for (int i = 0; i < 2; ++i) {
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(t.o(i, h, 0), 0.0f) << i << " " << h;
      EXPECT_FLOAT_EQ(t.lse_at(i, h), t.sinks[h]) << i << " " << h;
    }
  }
  for (int h = 0; h < 2; ++h) {
    const double e_s = std::exp(3.0), e_sink = std::exp(double{t.sinks[h]});
    EXPECT_NEAR(t.o(2, h, 0), 4.0 * e_s / (e_s + e_sink), kTol) << h;
    EXPECT_NEAR(t.lse_at(2, h), std::log(e_s + e_sink), kTol) << h;
  }
}

TEST(ReferenceSinks, SinkIsNotScaledCappedOrMasked) {
  // Two keys, sm_scale 0.5, soft cap 2: the scores go through both, the sink through neither.
  Dense t(1, 2, 1, 1, 1, 2, /*decode=*/true);
  t.p.use_sinks = true;
  t.p.sm_scale = 0.5f;
  t.p.logits_soft_cap = 2.0f;
  t.sinks = {1.25f};
  t.q = {2.0f};
  t.k = {1.0f, -3.0f};  // raw 2, -6; scaled 1, -3
  t.v = {1.0f, 0.0f, 0.0f, 1.0f};
  t.run();
  const double s0 = 2.0 * std::tanh(1.0 / 2.0), s1 = 2.0 * std::tanh(-3.0 / 2.0);
  const double denom = std::exp(s0) + std::exp(s1) + std::exp(1.25);
  EXPECT_NEAR(t.o(0, 0, 0), std::exp(s0) / denom, kTol);
  EXPECT_NEAR(t.o(0, 0, 1), std::exp(s1) / denom, kTol);
  EXPECT_NEAR(t.lse_at(0, 0), std::log(denom), kTol);
}

TEST(ReferenceSinks, LargeSinkDominatesWithoutOverflow) {
  Dense t(1, 1, 1, 1, 1, 1, /*decode=*/true);
  t.p.use_sinks = true;
  t.sinks = {200.0f};  // e^200 overflows nothing once the max is taken out
  t.q = {1.0f};
  t.k = {1.0f};
  t.v = {3.0f};
  t.run();
  EXPECT_NEAR(t.o(0, 0, 0), 3.0 * std::exp(1.0 - 200.0), 1e-30);
  EXPECT_NEAR(t.lse_at(0, 0), 200.0, 1e-4);
}

TEST(ReferenceScales, PerTokenScaleOfASingleToken) {
  // One e4m3 token (values exact in e4m3), scales 0.5 for K and 3 for V.
  Dense t(1, 1, 1, 1, 2, 2, /*decode=*/true);
  t.p.kv_dtype = DType::kE4M3;
  t.p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
  t.p.sm_scale = 1.0f;
  t.q = {1.0f, 2.0f};
  t.k = {4.0f, -1.0f};  // real K = (2, -0.5): s = 2 - 1 = 1
  t.v = {1.5f, -2.0f};  // real V = (4.5, -6)
  t.k_scale_cache = {0.5f};
  t.v_scale_cache = {3.0f};
  t.run();
  EXPECT_NEAR(t.o(0, 0, 0), 4.5, kTol);
  EXPECT_NEAR(t.o(0, 0, 1), -6.0, kTol);
  EXPECT_NEAR(t.lse_at(0, 0), 1.0, kTol);
}

TEST(ReferenceScales, PerTokenScalesWeighEachKeyAndValue) {
  // Two tokens with identical stored rows; only their scales differ.
  Dense t(1, 2, 1, 1, 1, 1, /*decode=*/true);
  t.p.kv_dtype = DType::kE5M2;
  t.p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
  t.p.sm_scale = 1.0f;
  t.q = {1.0f};
  t.k = {1.0f, 1.0f};
  t.v = {2.0f, 2.0f};
  t.k_scale_cache = {1.0f, 2.0f};  // s = 1, 2
  t.v_scale_cache = {0.5f, 4.0f};  // v = 1, 8
  t.run();
  const double e1 = std::exp(1.0), e2 = std::exp(2.0);
  EXPECT_NEAR(t.o(0, 0, 0), (e1 * 1.0 + e2 * 8.0) / (e1 + e2), kTol);
  EXPECT_NEAR(t.lse_at(0, 0), std::log(e1 + e2), kTol);
}

TEST(ReferenceScales, PerHeadScalesApplyToTheirKVHead) {
  // Two KV heads, one query head each; same stored data, different head scales.
  Dense t(1, 2, 2, 2, 1, 1, /*decode=*/true);
  t.p.kv_dtype = DType::kE4M3;
  t.p.kv_scale_granularity = KVScaleGranularity::kPerHead;
  t.p.sm_scale = 1.0f;
  t.q = {1.0f, 1.0f};
  t.k = {1.0f, 1.0f, 0.0f, 0.0f};  // key 0: 1 in both heads; key 1: 0
  t.v = {1.0f, 1.0f, 0.0f, 0.0f};
  t.k_scale = {1.0f, 2.0f};
  t.v_scale = {3.0f, 0.25f};
  t.run();
  for (int h = 0; h < 2; ++h) {
    const double s0 = t.k_scale[h], w0 = std::exp(s0), w1 = 1.0;
    EXPECT_NEAR(t.o(0, h, 0), w0 * t.v_scale[h] / (w0 + w1), kTol) << h;
    EXPECT_NEAR(t.lse_at(0, h), std::log(w0 + w1), kTol) << h;
  }
}

// q = 0 makes every score 0: o is the mean of the visible values and lse = log(kv_len), for any
// storage form. Head dim 96 (fa2's new size) through every operation.
void expect_mean_of_values(const Batch& batch, const Result& r, int b, int64_t row) {
  const Problem& p = batch.p;
  const int64_t kv = batch.kv_lens[b];
  std::vector<float> v(batch.v[b].size() / batch.kv_esize());
  testing::to_f32(batch.v[b].data(), p.kv_dtype, static_cast<int64_t>(v.size()), v.data());
  for (int h = 0; h < p.num_qo_heads; ++h) {
    const int kv_head = h / p.group_size();
    for (int d = 0; d < p.head_dim_vo; ++d) {
      double mean = 0;
      for (int64_t j = 0; j < kv; ++j)
        mean += v[(j * p.num_kv_heads + kv_head) * p.head_dim_vo + d];
      mean /= static_cast<double>(kv);
      ASSERT_NEAR(r.out[(row * p.num_qo_heads + h) * p.head_dim_vo + d], mean, 1e-5)
          << "request " << b << " row " << row << " head " << h << " d " << d;
    }
    ASSERT_NEAR(r.lse[row * p.num_qo_heads + h], std::log(static_cast<double>(kv)), 1e-5);
  }
}

Batch zero_query_batch(std::vector<int64_t> qo, std::vector<int64_t> kv) {
  Problem p;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim_qk = p.head_dim_vo = 96;
  p.q_dtype = p.kv_dtype = DType::kBF16;
  p.o_dtype = DType::kF32;
  Batch batch(p, std::move(qo), std::move(kv), 96);
  for (auto& q : batch.q) std::fill(q.begin(), q.end(), std::byte{0});
  return batch;
}

TEST(ReferenceHeadDim96, EveryOperationAveragesTheValuesUnderAZeroQuery) {
  const Batch decode = zero_query_batch({1, 1, 1}, {7, 33, 1});
  const Batch prefill = zero_query_batch({3, 1, 5}, {7, 33, 5});
  for (int b = 0; b < 3; ++b) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      const Result single_decode = run_single(decode, b, /*decode=*/true, layout);
      expect_mean_of_values(decode, single_decode, b, 0);
      const Result single_prefill = run_single(prefill, b, /*decode=*/false, layout);
      for (int64_t i = 0; i < prefill.qo_lens[b]; ++i) {
        expect_mean_of_values(prefill, single_prefill, b, i);
      }
    }
  }
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    PagedLayout paged;
    paged.layout = layout;
    paged.page_size = 5;
    const Result batch_decode = run_paged(decode, paged, /*decode=*/true);
    const Result batch_prefill = run_paged(prefill, paged, /*decode=*/false);
    int64_t row = 0;
    for (int b = 0; b < 3; ++b) {
      expect_mean_of_values(decode, batch_decode, b, b);
      for (int64_t i = 0; i < prefill.qo_lens[b]; ++i, ++row) {
        expect_mean_of_values(prefill, batch_prefill, b, row);
      }
    }
  }
  const Result ragged = run_ragged(prefill);
  int64_t row = 0;
  for (int b = 0; b < 3; ++b) {
    for (int64_t i = 0; i < prefill.qo_lens[b]; ++i, ++row) {
      expect_mean_of_values(prefill, ragged, b, row);
    }
  }
}

}  // namespace
}  // namespace kvattn::reftest
