// The numerics policy (docs/cuda.md "Numerics policy"), on every CPU-side backend: a NaN score of
// a visible key makes its row NaN (o and lse), also when every visible score is NaN, with a sink,
// and when split-KV cut the row into chunks; a masked key contributes nothing, even when its V
// is inf or NaN (never 0 * inf); merge_state propagates a NaN state and ignores a -inf one.
#include <cmath>
#include <string>
#include <vector>

#include "reference/ref_test_util.h"

namespace kvattn::reftest {
namespace {

class Policy : public ::testing::TestWithParam<std::string> {
 protected:
  void run(Dense& t, int64_t kv_chunk_size = 0) {
    AttentionArgs a = t.args();
    PlanOptions o;
    o.backend = GetParam();
    o.kv_chunk_size = kv_chunk_size;
    const Status s = kvattn::run(t.p, a, o);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
};
// Decode, split-KV and merge: every CPU-side backend.
using NumericsPolicy = Policy;
// Prefill rows and a masked key's inf/NaN V: the reference and the cpu prefill kernels (f32 here:
// the FMA kernel; tests/cpu/prefill_masked_value_test.cc runs every cpu kernel level).
using NumericsPolicyPrefill = Policy;
using NumericsPolicyPrefillMaskedValue = Policy;

// Two query rows over three keys, every value 1 except where a test puts a NaN or inf.
Dense ones(int64_t qo, int64_t kv) {
  Dense t(qo, kv, 1, 1, 4, 4);
  for (float& x : t.q) x = 0.25f;
  for (float& x : t.k) x = 1.0f;
  for (float& x : t.v) x = 1.0f;
  return t;
}

TEST_P(NumericsPolicyPrefill, AllNanScoresGiveANanRowNotAnEmptyOne) {
  Dense t = ones(2, 3);
  for (int d = 0; d < 4; ++d) t.q_at(0, 0, d) = NAN;  // every score of row 0 is NaN
  run(t);
  for (int d = 0; d < 4; ++d) EXPECT_TRUE(std::isnan(t.o(0, 0, d))) << "d " << d;
  EXPECT_TRUE(std::isnan(t.lse_at(0, 0))) << t.lse_at(0, 0);
  EXPECT_NEAR(t.o(1, 0, 0), 1.0, 1e-6);
  EXPECT_NEAR(t.lse_at(1, 0), std::log(3.0) + 0.5, 1e-5);  // every score (4 x 0.25) / sqrt(4)
}

TEST_P(NumericsPolicy, AllNanScoresWithASinkGiveNanNotTheSink) {
  Dense t = ones(1, 3);
  t.p.use_sinks = true;
  t.sinks = {0.5f};
  for (int d = 0; d < 4; ++d) t.q_at(0, 0, d) = NAN;
  run(t);
  EXPECT_TRUE(std::isnan(t.o(0, 0, 0)));
  EXPECT_TRUE(std::isnan(t.lse_at(0, 0))) << t.lse_at(0, 0);
}

TEST_P(NumericsPolicyPrefill, ANanKeyPoisonsOnlyTheRowsThatSeeIt) {
  Dense t = ones(2, 3);
  t.p.mask_mode = MaskMode::kCausal;  // row 0 sees keys 0, 1; row 1 sees 0, 1, 2
  t.k_at(2, 0, 1) = NAN;
  run(t);
  EXPECT_NEAR(t.o(0, 0, 0), 1.0, 1e-6);
  EXPECT_TRUE(std::isfinite(t.lse_at(0, 0)));
  EXPECT_TRUE(std::isnan(t.o(1, 0, 0)));
  EXPECT_TRUE(std::isnan(t.lse_at(1, 0)));
}

TEST_P(NumericsPolicyPrefillMaskedValue, AMaskedKeyWithInfOrNanValueContributesNothing) {
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    Dense t = ones(2, 3);
    t.p.mask_mode = MaskMode::kCausal;
    for (int d = 0; d < 4; ++d) t.v_at(2, 0, d) = bad;  // key 2: masked for row 0 only
    run(t);
    for (int d = 0; d < 4; ++d) EXPECT_NEAR(t.o(0, 0, d), 1.0, 1e-6) << "v = " << bad;
    // Custom mask: key 1 hidden from row 1.
    Dense c = ones(2, 3);
    c.p.mask_mode = MaskMode::kCustom;
    c.mask = {1, 1, 1, 1, 0, 1};
    for (int d = 0; d < 4; ++d) c.v_at(1, 0, d) = bad;
    run(c);
    for (int d = 0; d < 4; ++d) EXPECT_NEAR(c.o(1, 0, d), 1.0, 1e-6) << "v = " << bad;
  }
}

TEST_P(NumericsPolicy, DecodeRowOfNanScoresIsNan) {
  Dense t(1, 3, 2, 1, 4, 4, /*decode=*/true);
  for (float& x : t.q) x = 0.25f;
  for (float& x : t.k) x = 1.0f;
  for (float& x : t.v) x = 1.0f;
  for (int d = 0; d < 4; ++d) t.q_at(0, 1, d) = NAN;  // head 1: every score NaN
  run(t);
  EXPECT_NEAR(t.o(0, 0, 0), 1.0, 1e-6);
  EXPECT_TRUE(std::isnan(t.o(0, 1, 0)));
  EXPECT_TRUE(std::isnan(t.lse_at(0, 1))) << t.lse_at(0, 1);
}

TEST_P(NumericsPolicy, DecodeKeyOutsideTheWindowWithInfValueContributesNothing) {
  for (float bad : {INFINITY, NAN}) {
    Dense t(1, 4, 1, 1, 4, 4, /*decode=*/true);
    t.p.window_left = 1;  // the query (position 3) sees keys 2 and 3
    for (float& x : t.k) x = 1.0f;
    for (float& x : t.v) x = 1.0f;
    for (int d = 0; d < 4; ++d) t.v_at(0, 0, d) = bad;
    run(t);
    for (int d = 0; d < 4; ++d) EXPECT_NEAR(t.o(0, 0, d), 1.0, 1e-6) << "v = " << bad;
  }
}

TEST_P(NumericsPolicy, DecodeKeyHiddenByACustomMaskWithInfValueContributesNothing) {
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    for (bool packed : {false, true}) {
      Dense t(1, 5, 2, 1, 4, 4, /*decode=*/true);
      for (float& x : t.q) x = 0.25f;
      for (float& x : t.k) x = 1.0f;
      for (float& x : t.v) x = 1.0f;
      t.p.mask_mode = MaskMode::kCustom;
      t.mask_packed = packed;
      t.mask = packed ? std::vector<uint8_t>{0x1b} : std::vector<uint8_t>{1, 1, 0, 1, 1};
      for (int d = 0; d < 4; ++d) t.v_at(2, 0, d) = bad;  // key 2: hidden
      run(t);
      for (int h = 0; h < 2; ++h) {
        for (int d = 0; d < 4; ++d) {
          EXPECT_NEAR(t.o(0, h, d), 1.0, 1e-6) << "v = " << bad << " packed " << packed;
        }
        EXPECT_NEAR(t.lse_at(0, h), std::log(4.0) + 0.5, 1e-5);
      }
    }
  }
}

TEST_P(NumericsPolicy, SplitKvKeepsANanChunk) {
  // Decode over 600 keys cut into 256-key chunks: the NaN key sits in the last chunk only.
  Dense t(1, 600, 2, 1, 4, 4, /*decode=*/true);
  for (float& x : t.q) x = 0.25f;
  for (float& x : t.k) x = 1.0f;
  for (float& x : t.v) x = 1.0f;
  t.k_at(550, 0, 2) = NAN;
  run(t, 256);
  for (int h = 0; h < 2; ++h) {
    EXPECT_TRUE(std::isnan(t.o(0, h, 0))) << "head " << h << ": " << t.o(0, h, 0);
    EXPECT_TRUE(std::isnan(t.lse_at(0, h))) << "head " << h << ": " << t.lse_at(0, h);
  }
}

TEST_P(NumericsPolicy, MergeStatePropagatesNanAndIgnoresMinusInfinity) {
  const int64_t n = 3, h = 1, d = 2;
  std::vector<float> va = {1, 2, 3, 4, 5, 6}, vb = {INFINITY, NAN, 7, 8, 9, 10};
  std::vector<float> sa = {0.0f, NAN, 1.0f}, sb = {-INFINITY, 0.0f, -INFINITY};
  std::vector<float> vo(6, -1.0f), so(3, -1.0f);
  const auto view = [&](std::vector<float>& x, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(x.data(), DType::kF32, shape);
  };
  OpOptions o;
  o.backend = GetParam();
  ASSERT_TRUE(merge_state(view(va, {n, h, d}), view(sa, {n, h}), view(vb, {n, h, d}),
                          view(sb, {n, h}), view(vo, {n, h, d}), view(so, {n, h}), o)
                  .ok());
  // Row 0: b is -inf (its inf/NaN values are never read): a alone.
  EXPECT_EQ(vo[0], 1.0f);
  EXPECT_EQ(vo[1], 2.0f);
  EXPECT_EQ(so[0], 0.0f);
  // Row 1: a NaN state poisons the row.
  EXPECT_TRUE(std::isnan(vo[2]) && std::isnan(vo[3]) && std::isnan(so[1]));
  // Row 2: a alone again.
  EXPECT_EQ(vo[4], 5.0f);
  EXPECT_FLOAT_EQ(so[2], 1.0f);
}

INSTANTIATE_TEST_SUITE_P(Backends, NumericsPolicy, ::testing::Values("reference", "cpu"));
INSTANTIATE_TEST_SUITE_P(Backends, NumericsPolicyPrefill, ::testing::Values("reference", "cpu"));
INSTANTIATE_TEST_SUITE_P(Backends, NumericsPolicyPrefillMaskedValue,
                         ::testing::Values("reference", "cpu"));

}  // namespace
}  // namespace kvattn::reftest
