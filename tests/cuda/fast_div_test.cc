// The CUDA backends' division by the page size (cuda/common/fast_div.h, host and device), on the
// CPU.
#include "cuda/common/fast_div.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace kvattn {
namespace {

// fa2's and fa3's page lookups divide by the page size with a multiply and a shift: exact for every
// divisor a page size can be and every 32-bit dividend (edges and random ones).
TEST(FastDivTest, EqualsIntegerDivision) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (uint32_t d = 1; d <= 1100; ++d) {
    const cuda::FastDiv f(d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7fffffffu, 0xfffffffeu,
                       0xffffffffu, 0xffffffffu - d}) {
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
    }
    for (int i = 0; i < 200; ++i) {
      const uint32_t n = any(rng);
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
    }
  }
  for (uint32_t d : {4096u, 65535u, 65536u, 1000003u, 0x7fffffffu, 0x80000001u, 0xffffffffu}) {
    const cuda::FastDiv f(d);
    for (int i = 0; i < 2000; ++i) {
      const uint32_t n = any(rng);
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
}  // namespace kvattn
