// The reference's element reads and writes: exact reads of every dtype, and writes rounded once,
// to nearest even, from the fp64 value (not twice through f32).
#include "reference/element_io.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/numeric.h"

namespace kvattn::ref {
namespace {

TEST(ReferenceElementIo, DoubleRoundsOnceToSixteenBits) {
  // 1 + 2^-8 + 2^-40 is just above the bf16 tie between 1 and 1 + 2^-7: the answer is 1 + 2^-7.
  // Through f32 first it would become the tie 1 + 2^-8 and round to even, 1.
  const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(round_to_dtype(above_tie, DType::kBF16), 1.0 + std::ldexp(1.0, -7));
  const double below_tie = 1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -40);
  EXPECT_EQ(round_to_dtype(below_tie, DType::kBF16), 1.0);
  // f16 (10 mantissa bits): the same just above its tie 1 + 2^-11.
  EXPECT_EQ(round_to_dtype(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -45), DType::kF16),
            1.0 + std::ldexp(1.0, -10));
  // Exact ties still go to even.
  EXPECT_EQ(round_to_dtype(1.0 + std::ldexp(1.0, -11), DType::kF16), 1.0);
  EXPECT_EQ(round_to_dtype(1.0 + 3 * std::ldexp(1.0, -11), DType::kF16), 1.0 + std::ldexp(1.0, -9));
}

TEST(ReferenceElementIo, Fp8WritesSaturateAndKeepNan) {
  EXPECT_EQ(round_to_dtype(1e6, DType::kE4M3), 448.0);
  EXPECT_EQ(round_to_dtype(-1e9, DType::kE5M2), -57344.0);
  EXPECT_EQ(round_to_dtype(INFINITY, DType::kE4M3), 448.0);
  EXPECT_TRUE(std::isnan(round_to_dtype(NAN, DType::kE4M3)));
  // Between 1 and 1.125 (e4m3 step at 1): just above the middle goes up.
  EXPECT_EQ(round_to_dtype(1.0625 + 1e-12, DType::kE4M3), 1.125);
  EXPECT_EQ(round_to_dtype(1.0625, DType::kE4M3), 1.0);
}

TEST(ReferenceElementIo, SixteenBitOverflowIsInfinite) {
  EXPECT_EQ(round_to_dtype(1e6, DType::kF16), INFINITY);
  EXPECT_EQ(round_to_dtype(65519.0, DType::kF16), 65504.0);
}

TEST(ReferenceElementIo, StridedReadsFollowTheStrides) {
  uint16_t data[6];
  for (int i = 0; i < 6; ++i) data[i] = num::f32_to_f16(static_cast<float>(i));
  // A [3, 2] view transposed out of a [2, 3] buffer.
  TensorView t = TensorView::strided(data, DType::kF16, {3, 2}, {1, 3});
  EXPECT_EQ(load(t, 0, 1), 3.0);
  EXPECT_EQ(load(t, 2, 0), 2.0);
  EXPECT_EQ(load(t, 2, 1), 5.0);
}

}  // namespace
}  // namespace kvattn::ref
