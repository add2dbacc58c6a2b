// Exhaustive tests of the scalar conversions (DESIGN.md §2 "Data types").
#include "core/numeric.h"
#include "core/cpu_features.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace kvattn::num {
namespace {

// An independent decoder: value = (-1)^s * 2^(e - bias) * (1 + m / 2^M), subnormals without
// the implicit one, written with ldexp.
template <int E, int M, bool kHasInf>
double decode_by_formula(uint32_t code) {
  const int bias = (1 << (E - 1)) - 1;
  const uint32_t sign = (code >> (E + M)) & 1;
  const uint32_t e = (code >> M) & ((1u << E) - 1);
  const uint32_t m = code & ((1u << M) - 1);
  const double s = sign ? -1.0 : 1.0;
  if (e == (1u << E) - 1) {
    if (kHasInf) return m == 0 ? s * INFINITY : NAN;
    if (m == (1u << M) - 1) return NAN;
  }
  if (e == 0) return s * std::ldexp(double(m), 1 - bias - M);
  return s * std::ldexp(1.0 + double(m) / (1 << M), int(e) - bias);
}

// An independent encoder: the nearest finite code by search, ties to the even code, past the
// largest finite value saturating (as satfinite does).
template <int E, int M, bool kHasInf>
uint32_t encode_by_search(float x) {
  const uint32_t ncodes = 1u << (E + M + 1);
  if (std::isnan(x)) return ~0u;  // caller checks NaN separately
  uint32_t best = 0;
  double best_err = INFINITY;
  double best_mag = 0;
  for (uint32_t c = 0; c < ncodes; ++c) {
    double v = decode_by_formula<E, M, kHasInf>(c);
    if (!std::isfinite(v)) continue;
    if (std::signbit(v) != std::signbit(x) && v == 0) continue;  // keep the sign of zero
    double err = std::fabs(v - double(x));
    if (std::isinf(x)) err = -std::fabs(v) * (std::signbit(v) == std::signbit(x) ? 1 : -1);
    bool better = err < best_err;
    if (err == best_err && std::fabs(v) == best_mag && v != 0) better = false;
    if (err == best_err && !better && std::isfinite(x)) {
      better = (c & 1u) == 0 && (best & 1u) == 1;  // tie: the even mantissa
    }
    if (better) {
      best = c;
      best_err = err;
      best_mag = std::fabs(v);
    }
  }
  return best;
}

TEST(NumericTest, E4M3DecodesEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    double want = decode_by_formula<4, 3, false>(c);
    float got = e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << c;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // min subnormal
}

TEST(NumericTest, E5M2DecodesEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    double want = decode_by_formula<5, 2, true>(c);
    float got = e5m2_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
    }
  }
  EXPECT_EQ(e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0x7c)));
  EXPECT_EQ(e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
}

TEST(NumericTest, Fp8RoundTripsEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    float v = e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(v))));
    } else {
      EXPECT_EQ(f32_to_e4m3(v), c) << c;
    }
    float w = e5m2_to_f32(uint8_t(c));
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(e5m2_to_f32(f32_to_e5m2(w))));
    } else if (std::isinf(w)) {
      EXPECT_EQ(f32_to_e5m2(w), (c & 0x80) | 0x7b) << "inf saturates to max";
    } else {
      EXPECT_EQ(f32_to_e5m2(w), c) << c;
    }
  }
}

TEST(NumericTest, Fp8QuantizeBoundaries) {
  // Past max and infinities saturate; NaN stays NaN.
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // halfway to the (nonexistent) 480: saturates
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e9f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xfe);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(NAN))));
  EXPECT_EQ(f32_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(INFINITY), 0x7b);
  EXPECT_EQ(f32_to_e5m2(-INFINITY), 0xfb);
  EXPECT_TRUE(std::isnan(e5m2_to_f32(f32_to_e5m2(NAN))));
  // Min subnormal and the ties around it: half of it rounds to even (zero), just above rounds up.
  const float e4m3_min = std::ldexp(1.0f, -9);
  EXPECT_EQ(f32_to_e4m3(e4m3_min), 0x01);
  EXPECT_EQ(f32_to_e4m3(e4m3_min / 2), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(e4m3_min / 2, 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(e4m3_min * 1.5f), 0x02);  // tie between 1 and 2: even
  EXPECT_EQ(f32_to_e4m3(-e4m3_min / 2), 0x80);    // -0
  // Halfway between 1.0 (0x38) and 1.125 (0x39): even -> 0x38; 1.125..1.25 -> 0x3a.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);
  EXPECT_EQ(f32_to_e5m2(1.125f), 0x3c);  // 1.0 | 1.25: tie -> even (1.0)
  EXPECT_EQ(f32_to_e5m2(1.375f), 0x3e);  // 1.25 | 1.5: tie -> even (1.5)
}

TEST(NumericTest, Fp8QuantizeMatchesNearestSearch) {
  std::mt19937 rng(7);
  std::vector<float> values;
  // Every code's value, the midpoints between neighbours and points just around them.
  for (uint32_t c = 0; c < 128; ++c) {
    for (float v : {e4m3_to_f32(uint8_t(c)), e5m2_to_f32(uint8_t(c))}) {
      if (!std::isfinite(v)) continue;
      for (float s : {1.0f, -1.0f}) {
        values.push_back(s * v);
        values.push_back(std::nextafter(s * v, INFINITY));
        values.push_back(std::nextafter(s * v, -INFINITY));
      }
    }
  }
  for (uint32_t c = 0; c + 1 < 127; ++c) {
    float a = e4m3_to_f32(uint8_t(c)), b = e4m3_to_f32(uint8_t(c + 1));
    values.push_back((a + b) / 2);
    a = e5m2_to_f32(uint8_t(c)), b = e5m2_to_f32(uint8_t(c + 1));
    if (std::isfinite(b)) values.push_back((a + b) / 2);
  }
  std::uniform_real_distribution<float> exp(-20.0f, 18.0f);
  for (int i = 0; i < 20000; ++i) {
    float v = std::exp2(exp(rng)) * (rng() & 1 ? 1.0f : -1.0f);
    values.push_back(v);
  }
  for (float v : values) {
    ASSERT_EQ(f32_to_e4m3(v), (encode_by_search<4, 3, false>(v))) << v;
    ASSERT_EQ(f32_to_e5m2(v), (encode_by_search<5, 2, true>(v))) << v;
  }
}

TEST(NumericTest, SixteenBitRoundTripsEveryCode) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float h = f16_to_f32(uint16_t(c));
    double want = decode_by_formula<5, 10, true>(c);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(h)) << c;
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(h))));
    } else {
      ASSERT_EQ(double(h), want) << c;
      ASSERT_EQ(f32_to_f16(h), c) << c;
    }
    float b = bf16_to_f32(uint16_t(c));
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(b))));
    } else {
      ASSERT_EQ(f32_to_bf16(b), c) << c;
    }
  }
}

// f32 -> f16 against the hardware converter (F16C, round to nearest even) on every f32 whose
// top 20 bits vary (all exponents, the rounding-relevant mantissa bits) plus random low bits.
__attribute__((target("f16c"))) uint16_t hw_f16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

TEST(NumericTest, F16MatchesHardwareRounding) {
  if (!detail::cpu_features().f16c) GTEST_SKIP() << "no F16C on this CPU";
  std::mt19937 rng(11);
  for (uint32_t hi = 0; hi < (1u << 20); ++hi) {
    uint32_t bits = (hi << 12) | (rng() & 0xfffu);
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), hw_f16(f)) << std::hex << bits;
    uint32_t tie = (hi << 12) | 0x1000u;  // exercises exact ties at the f16 rounding bit
    std::memcpy(&f, &tie, 4);
    if (!std::isnan(f)) ASSERT_EQ(f32_to_f16(f), hw_f16(f)) << std::hex << tie;
  }
}

TEST(NumericTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: even -> 1.0.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway past max rounds to inf (IEEE)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even
}

}  // namespace
}  // namespace kvattn::num
