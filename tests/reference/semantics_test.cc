// Hand-computed cases, one per rule of DESIGN.md §2: each expected value is worked out in the test
// from the rule itself, on inputs small enough to check on paper.
#include <cmath>

#include "reference/ref_test_util.h"

namespace kvattn::reftest {
namespace {

constexpr double kTol = 1e-6;  // f32 outputs of fp64 math: only the final rounding to f32

TEST(ReferenceSemantics, SingleKeyGivesItsValueAndTheScoreAsLse) {
  Dense t(1, 1, 1, 1, 2, 3);
  t.q = {1, 2};
  t.k = {3, 4};
  t.v = {5, -6, 7};
  t.run();
  EXPECT_FLOAT_EQ(t.o(0, 0, 0), 5);
  EXPECT_FLOAT_EQ(t.o(0, 0, 1), -6);
  EXPECT_FLOAT_EQ(t.o(0, 0, 2), 7);
  // Default sm_scale 1/sqrt(D_qk): s = 11 / sqrt(2).
  EXPECT_NEAR(t.lse_at(0, 0), 11.0 / std::sqrt(2.0), kTol);
}

TEST(ReferenceSemantics, SoftmaxOverTwoKeysWithExplicitSmScale) {
  Dense t(1, 2, 1, 1, 2, 1);
  t.p.sm_scale = 2.0f;
  t.q = {1, 0};
  t.k = {1, 0, 0, 1};  // s0 = 2, s1 = 0
  t.v = {10, -4};
  t.run();
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(t.o(0, 0, 0), (e2 * 10 - 4) / (e2 + 1), kTol);
  EXPECT_NEAR(t.lse_at(0, 0), std::log(e2 + 1), kTol);
}

TEST(ReferenceSemantics, SoftCapIsAppliedAfterSmScale) {
  Dense t(1, 2, 1, 1, 1, 1);
  t.p.sm_scale = 0.5f;
  t.p.logits_soft_cap = 1.5f;
  t.q = {2};
  t.k = {3, -1};  // raw 6, -2; scaled 3, -1
  t.v = {1, 0};
  t.run();
  const double s0 = 1.5 * std::tanh(3.0 / 1.5), s1 = 1.5 * std::tanh(-1.0 / 1.5);
  EXPECT_NEAR(t.lse_at(0, 0), std::log(std::exp(s0) + std::exp(s1)), kTol);
  EXPECT_NEAR(t.o(0, 0, 0), std::exp(s0) / (std::exp(s0) + std::exp(s1)), kTol);
}

TEST(ReferenceSemantics, StandardAlibiSlopes) {
  // Powers of two: 2^(-8(h+1)/H).
  EXPECT_DOUBLE_EQ(alibi_slope(0, 8), 0.5);
  EXPECT_DOUBLE_EQ(alibi_slope(7, 8), std::exp2(-8.0));
  // H = 3: n = 2 gives 2^-4, 2^-8, then the odd powers of 2^(-4/n): 2^-2.
  EXPECT_DOUBLE_EQ(alibi_slope(0, 3), std::exp2(-4.0));
  EXPECT_DOUBLE_EQ(alibi_slope(1, 3), std::exp2(-8.0));
  EXPECT_DOUBLE_EQ(alibi_slope(2, 3), std::exp2(-2.0));
  // H = 6: n = 4: 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3.
  EXPECT_DOUBLE_EQ(alibi_slope(3, 6), std::exp2(-8.0));
  EXPECT_DOUBLE_EQ(alibi_slope(4, 6), std::exp2(-1.0));
  EXPECT_DOUBLE_EQ(alibi_slope(5, 6), std::exp2(-3.0));
}

// q = 0 so every score is the ALiBi bias slope * (j - i_abs); decode: i_abs = kv_len - 1.
void expect_alibi_weights(const Dense& t, int h, double slope) {
  const int64_t kv = t.kv_len;
  double sum = 0, weighted = 0;
  for (int64_t j = 0; j < kv; ++j) {
    const double w = std::exp(slope * static_cast<double>(j - (kv - 1)));
    sum += w;
    weighted += w * static_cast<double>(j);
  }
  EXPECT_NEAR(t.o(0, h, 0), weighted / sum, kTol) << "head " << h;
  EXPECT_NEAR(t.lse_at(0, h), std::log(sum), kTol) << "head " << h;
}

TEST(ReferenceSemantics, AlibiBiasPerHeadWithNonPowerOfTwoHeads) {
  Dense t(1, 4, 3, 1, 2, 1, /*decode=*/true);
  t.p.pos_encoding_mode = PosEncoding::kAlibi;
  for (int j = 0; j < 4; ++j) t.v_at(j, 0, 0) = static_cast<float>(j);
  t.run();
  for (int h = 0; h < 3; ++h) expect_alibi_weights(t, h, alibi_slope(h, 3));
}

TEST(ReferenceSemantics, AlibiSlopesFromArguments) {
  Dense t(1, 4, 2, 1, 2, 1, /*decode=*/true);
  t.p.pos_encoding_mode = PosEncoding::kAlibi;
  t.alibi_slopes = {0.75f, 3.0f};
  for (int j = 0; j < 4; ++j) t.v_at(j, 0, 0) = static_cast<float>(j);
  t.run();
  expect_alibi_weights(t, 0, 0.75);
  expect_alibi_weights(t, 1, 3.0);
}

TEST(ReferenceSemantics, AlibiUsesTheAbsoluteQueryPositionInPrefill) {
  // qo_len 2, kv_len 3: query i sits at i_abs = i + 1; q = 0 so s = slope * (j - i_abs).
  Dense t(2, 3, 1, 1, 1, 1);
  t.p.pos_encoding_mode = PosEncoding::kAlibi;
  t.alibi_slopes = {1.0f};
  t.v = {0, 1, 2};
  t.run();
  for (int i = 0; i < 2; ++i) {
    double sum = 0, weighted = 0;
    for (int j = 0; j < 3; ++j) {
      const double w = std::exp(static_cast<double>(j - (i + 1)));
      sum += w;
      weighted += w * j;
    }
    EXPECT_NEAR(t.o(i, 0, 0), weighted / sum, kTol) << "row " << i;
    EXPECT_NEAR(t.lse_at(i, 0), std::log(sum), kTol) << "row " << i;
  }
}

TEST(ReferenceSemantics, AlibiIsAddedAfterTheSoftCap) {
  Dense t(1, 2, 1, 1, 1, 1, /*decode=*/true);
  t.p.pos_encoding_mode = PosEncoding::kAlibi;
  t.p.logits_soft_cap = 1.0f;
  t.p.sm_scale = 1.0f;
  t.alibi_slopes = {2.0f};
  t.q = {4};
  t.k = {1, 1};  // both scaled scores 4 -> capped tanh(4); bias -2 for key 0, 0 for key 1
  t.v = {1, 0};
  t.run();
  const double capped = std::tanh(4.0);
  const double s0 = capped - 2.0, s1 = capped;
  EXPECT_NEAR(t.lse_at(0, 0), std::log(std::exp(s0) + std::exp(s1)), kTol);
}

// D = 2: a single pair with frequency 1, so the angle is pos / rope_scale.
TEST(ReferenceSemantics, RopeRotatesByRelativePosition) {
  Dense t(1, 3, 1, 1, 2, 1, /*decode=*/true);  // query at position 2
  t.p.pos_encoding_mode = PosEncoding::kRopeLlama;
  t.p.rope_scale = 2.0f;
  t.p.sm_scale = 1.0f;
  t.q = {1, 0};
  t.k = {1, 0, 1, 0, 1, 0};
  t.v = {0, 1, 2};
  t.run();
  double sum = 0, weighted = 0;
  for (int j = 0; j < 3; ++j) {
    const double s = std::cos((2.0 - j) / 2.0);  // rot(q, 2) . rot(k, j)
    sum += std::exp(s);
    weighted += std::exp(s) * j;  // V is never rotated
  }
  EXPECT_NEAR(t.lse_at(0, 0), std::log(sum), kTol);
  EXPECT_NEAR(t.o(0, 0, 0), weighted / sum, kTol);
}

// D = 4, x = e1: non-interleaved, x[1] pairs with x[3] at frequency theta^(-2/4); interleaved, it
// pairs with x[0] at frequency 1.
void check_rope_pairing(bool interleave) {
  Dense t(1, 2, 1, 1, 4, 1, /*decode=*/true);  // query at position 1
  t.p.pos_encoding_mode = PosEncoding::kRopeLlama;
  t.p.rope_theta = 100.0f;
  t.p.rope_interleave = interleave;
  t.p.sm_scale = 1.0f;
  t.q = {0, 1, 0, 0};
  t.k = {0, 1, 0, 0, 0, 1, 0, 0};
  t.v = {1, 0};
  t.run();
  const double freq = interleave ? 1.0 : 0.1;
  const double s0 = std::cos(1.0 * freq), s1 = 1.0;
  EXPECT_NEAR(t.lse_at(0, 0), std::log(std::exp(s0) + std::exp(s1)), kTol)
      << (interleave ? "interleaved" : "rotate halves");
}
TEST(ReferenceSemantics, RopeRotateHalvesPairing) { check_rope_pairing(false); }
TEST(ReferenceSemantics, RopeInterleavedPairing) { check_rope_pairing(true); }

// q = 0: every visible key has the same weight, so o = the mean of the visible values.
Dense uniform(int64_t qo, int64_t kv) {
  Dense t(qo, kv, 1, 1, 1, 1);
  for (int64_t j = 0; j < kv; ++j) t.v_at(j, 0, 0) = static_cast<float>(1 << j);
  return t;
}
double mean_of_keys(int64_t from, int64_t to) {  // values 2^j over j in [from, to]
  double sum = 0;
  for (int64_t j = from; j <= to; ++j) sum += std::exp2(static_cast<double>(j));
  return sum / static_cast<double>(to - from + 1);
}

TEST(ReferenceSemantics, CausalMaskIsBottomRightAligned) {
  Dense t = uniform(2, 3);
  t.p.mask_mode = MaskMode::kCausal;
  t.run();
  EXPECT_NEAR(t.o(0, 0, 0), mean_of_keys(0, 1), kTol);  // i = 0 sees j <= 0 + (3 - 2)
  EXPECT_NEAR(t.o(1, 0, 0), mean_of_keys(0, 2), kTol);
  EXPECT_NEAR(t.lse_at(0, 0), std::log(2.0), kTol);
}

TEST(ReferenceSemantics, SlidingWindowWithCausal) {
  Dense t = uniform(3, 5);
  t.p.mask_mode = MaskMode::kCausal;
  t.p.window_left = 1;
  t.run();
  for (int i = 0; i < 3; ++i) {
    const int64_t i_abs = i + 2;
    EXPECT_NEAR(t.o(i, 0, 0), mean_of_keys(i_abs - 1, i_abs), kTol) << "row " << i;
  }
}

TEST(ReferenceSemantics, SlidingWindowWithoutCausalKeepsLaterKeys) {
  Dense t = uniform(2, 4);
  t.p.window_left = 0;
  t.run();
  EXPECT_NEAR(t.o(0, 0, 0), mean_of_keys(2, 3), kTol);  // i_abs = 2: j >= 2, no upper limit
  EXPECT_NEAR(t.o(1, 0, 0), mean_of_keys(3, 3), kTol);
}

TEST(ReferenceSemantics, CustomMaskUnpackedAndPackedAgree) {
  // 2 x 5 = 10 bits: the packed form spans two bytes.
  const uint8_t bits[2][5] = {{1, 0, 1, 1, 0}, {0, 0, 0, 0, 1}};
  Dense unpacked = uniform(2, 5), packed = uniform(2, 5);
  unpacked.p.mask_mode = packed.p.mask_mode = MaskMode::kCustom;
  packed.mask_packed = true;
  packed.mask.assign(2, 0);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 5; ++j) {
      unpacked.mask.push_back(bits[i][j]);
      const int bit = i * 5 + j;
      if (bits[i][j]) packed.mask[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
  unpacked.run();
  packed.run();
  for (Dense* t : {&unpacked, &packed}) {
    EXPECT_NEAR(t->o(0, 0, 0), (1 + 4 + 8) / 3.0, kTol);
    EXPECT_NEAR(t->o(1, 0, 0), 16.0, kTol);
    EXPECT_NEAR(t->lse_at(0, 0), std::log(3.0), kTol);
  }
}

TEST(ReferenceSemantics, RowThatSeesNoKeyGivesZeroAndMinusInfinity) {
  Dense t = uniform(2, 3);
  t.p.mask_mode = MaskMode::kCustom;
  t.mask = {0, 0, 0, 1, 1, 0};
  t.run();
  EXPECT_EQ(t.o(0, 0, 0), 0.0f);
  EXPECT_EQ(t.lse_at(0, 0), -INFINITY);
  EXPECT_NEAR(t.o(1, 0, 0), 1.5, kTol);
}

TEST(ReferenceSemantics, ScalesMultiplyStoredValuesForEveryDtype) {
  // f32 storage with scales: real q = 2 * 0.5, real k = (1, 3) * 4, real v = (1, 2) * 8.
  Dense t(1, 2, 1, 1, 1, 1);
  t.p.sm_scale = 1.0f;
  t.scalars.q_scale = 0.5f;
  t.scalars.k_scale = 4.0f;
  t.scalars.v_scale = 8.0f;
  t.q = {2};
  t.k = {1, 3};
  t.v = {1, 2};
  t.run();
  const double s0 = 1.0 * 4.0, s1 = 1.0 * 12.0;
  const double e0 = std::exp(s0), e1 = std::exp(s1);
  EXPECT_NEAR(t.lse_at(0, 0), std::log(e0 + e1), kTol);
  EXPECT_NEAR(t.o(0, 0, 0), (e0 * 8 + e1 * 16) / (e0 + e1), kTol);
}

TEST(ReferenceSemantics, Fp8KeysAndValuesAreDequantizedWithTheirScales) {
  // e4m3 codes: 0x38 = 1.0, 0x40 = 2.0, 0x44 = 3.0; e5m2 q code 0x3c = 1.0.
  Problem p;
  p.op = Op::kSingleDecode;
  p.num_qo_heads = p.num_kv_heads = 1;
  p.head_dim_qk = p.head_dim_vo = 1;
  p.q_dtype = DType::kE5M2;
  p.kv_dtype = DType::kE4M3;
  p.o_dtype = DType::kF32;
  p.sm_scale = 1.0f;
  uint8_t q[1] = {0x3c}, k[2] = {0x38, 0x44}, v[2] = {0x40, 0x44};
  float out[1] = {NAN}, lse[1] = {NAN};
  AttentionArgs a;
  a.q = TensorView::contiguous(q, p.q_dtype, {1, 1});
  a.k = TensorView::contiguous(k, p.kv_dtype, {2, 1, 1});
  a.v = TensorView::contiguous(v, p.kv_dtype, {2, 1, 1});
  a.out = TensorView::contiguous(out, DType::kF32, {1, 1});
  a.lse = TensorView::contiguous(lse, DType::kF32, {1});
  a.scalars.q_scale = 0.25f;
  a.scalars.k_scale = 2.0f;
  a.scalars.v_scale = 0.5f;
  ASSERT_TRUE(run_reference(p, a).ok());
  const double s0 = 0.25 * 2.0, s1 = 0.25 * 6.0;  // real q = 0.25, real k = 2, 6
  const double e0 = std::exp(s0), e1 = std::exp(s1);
  EXPECT_NEAR(lse[0], std::log(e0 + e1), kTol);
  EXPECT_NEAR(out[0], (e0 * 1.0 + e1 * 1.5) / (e0 + e1), kTol);  // real v = 1, 1.5
}

// use_fp16_qk_reduction: the raw dot product is rounded to f16 before sm_scale.
TEST(ReferenceSemantics, Fp16QkReductionRoundsTheRawDotProduct) {
  const float raw = 1.0f + 3.0f / 4096.0f;  // f16 neighbours: 1 and 1 + 2^-10; nearest 1 + 2^-10
  for (bool reduce : {false, true}) {
    Dense t(1, 1, 1, 1, 1, 1);
    t.p.use_fp16_qk_reduction = reduce;
    t.p.sm_scale = 3.0f;
    t.q = {raw};
    t.k = {1.0f};
    t.v = {1.0f};
    t.run();
    // Rounding after sm_scale instead would give f16(3.0022) = 3 + 2^-9.
    const double expected = reduce ? 3.0 * (1.0 + 1.0 / 1024) : 3.0 * raw;
    EXPECT_NEAR(t.lse_at(0, 0), expected, 1e-7) << "reduce " << reduce;
  }
}

TEST(ReferenceSemantics, GroupedQueryHeadsUseTheirKvHead) {
  Dense t(1, 1, 4, 2, 1, 1);
  t.v = {10, 20};  // kv head 0: 10, kv head 1: 20
  t.run();
  EXPECT_EQ(t.o(0, 0, 0), 10);
  EXPECT_EQ(t.o(0, 1, 0), 10);
  EXPECT_EQ(t.o(0, 2, 0), 20);
  EXPECT_EQ(t.o(0, 3, 0), 20);
}

TEST(ReferenceSemantics, OutputIsRoundedToNearestEvenInTheOutputDtype) {
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie (-> 1), 1 + 3*2^-8 a tie (-> 1 + 2^-6).
  const float values[] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.5f / 256};
  const float expected[] = {1.0f, 1.0f + 1.0f / 64, 1.0f + 1.0f / 128};
  for (int c = 0; c < 3; ++c) {
    Problem p;
    p.op = Op::kSingleDecode;
    p.num_qo_heads = p.num_kv_heads = 1;
    p.head_dim_qk = p.head_dim_vo = 1;
    p.q_dtype = p.kv_dtype = DType::kF32;
    p.o_dtype = DType::kBF16;
    float q[1] = {0}, k[1] = {0}, v[1] = {values[c]};
    uint16_t out[1] = {0xffff};
    AttentionArgs a;
    a.q = TensorView::contiguous(q, DType::kF32, {1, 1});
    a.k = TensorView::contiguous(k, DType::kF32, {1, 1, 1});
    a.v = TensorView::contiguous(v, DType::kF32, {1, 1, 1});
    a.out = TensorView::contiguous(out, DType::kBF16, {1, 1});
    ASSERT_TRUE(run_reference(p, a).ok());
    float got;
    testing::to_f32(out, DType::kBF16, 1, &got);
    EXPECT_EQ(got, expected[c]) << "case " << c;
  }
}

TEST(ReferenceSemantics, DifferentQkAndVoHeadDims) {
  Dense t(1, 2, 1, 1, 3, 5);
  t.p.sm_scale = 1.0f;
  t.q = {1, 1, 1};
  t.k = {1, 0, 0, 0, 0, 0};  // s0 = 1, s1 = 0
  for (int d = 0; d < 5; ++d) {
    t.v_at(0, 0, d) = static_cast<float>(d);
    t.v_at(1, 0, d) = -1.0f;
  }
  t.run();
  const double e = std::exp(1.0);
  for (int d = 0; d < 5; ++d) EXPECT_NEAR(t.o(0, 0, d), (e * d - 1) / (e + 1), kTol);
}

}  // namespace
}  // namespace kvattn::reftest
