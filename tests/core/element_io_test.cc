// core/element_io.h: every code of every storage dtype reads as core/numeric.h decodes it, writes
// round as numeric.h encodes, at any byte alignment; f64 writes round once (the reference's
// tests/reference/element_io_test.cc checks the ties through ref::store_element).
#include "core/element_io.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace kvattn::io {
namespace {

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(ElementIo, EveryCodeReadsAsNumericDecodesItAtAnyAlignment) {
  unsigned char buf[16];
  for (int shift = 0; shift < 4; ++shift) {
    for (uint32_t code = 0; code < 65536; ++code) {
      const uint16_t h = static_cast<uint16_t>(code);
      std::memcpy(buf + shift, &h, 2);
      ASSERT_TRUE(same(load_f32(buf + shift, DType::kF16, 0), num::f16_to_f32(h))) << code;
      ASSERT_TRUE(same(load_f32(buf + shift, DType::kBF16, 0), num::bf16_to_f32(h))) << code;
      if (code < 256) {
        const uint8_t c = static_cast<uint8_t>(code);
        buf[shift + 1] = c;
        ASSERT_TRUE(same(load_f32(buf + shift, DType::kE4M3, 1), num::e4m3_to_f32(c))) << code;
        ASSERT_TRUE(same(load_f32(buf + shift, DType::kE5M2, 1), num::e5m2_to_f32(c))) << code;
        EXPECT_EQ(load_f32(buf + shift, DType::kU8, 1), static_cast<float>(c));
      }
    }
    const float x = -3.25f;
    std::memcpy(buf + shift + 4, &x, 4);
    EXPECT_EQ(load_f32(buf + shift, DType::kF32, 1), x);
    const int32_t big = (1 << 30) + 1;  // not exact in f32, exact in f64
    std::memcpy(buf + shift + 4, &big, 4);
    EXPECT_EQ(load_f64(buf + shift, DType::kI32, 1), static_cast<double>(big));
  }
}

TEST(ElementIo, WritesRoundAsNumericEncodesAtAnyAlignment) {
  const float values[] = {0.0f,  -0.0f,  1.0f,  1.00390625f, -2.7182818f, 1e-7f,
                          3e38f, 500.0f, -1e5f, INFINITY,    -INFINITY,   NAN};
  unsigned char buf[16];
  for (int shift = 0; shift < 4; ++shift) {
    for (float x : values) {
      uint16_t h;
      store_f32(buf + shift, DType::kF16, 1, x);
      std::memcpy(&h, buf + shift + 2, 2);
      EXPECT_EQ(h, num::f32_to_f16(x)) << x;
      store_f32(buf + shift, DType::kBF16, 1, x);
      std::memcpy(&h, buf + shift + 2, 2);
      EXPECT_EQ(h, num::f32_to_bf16(x)) << x;
      store_f32(buf + shift, DType::kE4M3, 3, x);
      EXPECT_EQ(buf[shift + 3], num::f32_to_e4m3(x)) << x;
      store_f32(buf + shift, DType::kE5M2, 3, x);
      EXPECT_EQ(buf[shift + 3], num::f32_to_e5m2(x)) << x;
      store_f32(buf + shift, DType::kF32, 1, x);
      float back;
      std::memcpy(&back, buf + shift + 4, 4);
      EXPECT_TRUE(same(back, x)) << x;
    }
  }
}

TEST(ElementIo, F64WritesRoundOnce) {
  // Just above the bf16 tie between 1 and 1 + 2^-7: through f32 first it would be the tie itself
  // and round to even (1).
  unsigned char buf[4];
  store_f64(buf, DType::kBF16, 0, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40));
  EXPECT_EQ(load_f32(buf, DType::kBF16, 0), 1.0f + std::ldexp(1.0f, -7));
  store_f64(buf, DType::kE4M3, 0, 1e6);  // saturates
  EXPECT_EQ(load_f32(buf, DType::kE4M3, 0), 448.0f);
  store_f64(buf, DType::kI32, 0, -123456.0);
  EXPECT_EQ(load_f64(buf, DType::kI32, 0), -123456.0);
}

}  // namespace
}  // namespace kvattn::io
