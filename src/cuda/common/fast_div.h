// Division by a divisor fixed at launch (the page size: fa2's and fa3's page lookups) with a
// multiply-high and a shift instead of a hardware-less 64-bit division: Granlund-Montgomery, as
// FlashInfer's uint_fastdiv. Exact for every 32-bit dividend; host and device
// (tests/cuda/fast_div_test.cc checks it).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::cuda {

struct FastDiv {
  uint32_t divisor = 1;
  uint32_t mul = 0;
  uint32_t shift = 0;

  FastDiv() = default;
  // divisor >= 1. shift = ceil(log2 d); mul = floor(2^32 (2^shift - d) / d) + 1.
  explicit FastDiv(uint32_t d) : divisor(d) {
    while ((uint64_t(1) << shift) < d) ++shift;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }

  KVATTN_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * mul) >> 32);
#endif
    return uint32_t((uint64_t(hi) + n) >> shift);
  }
};

}  // namespace kvattn::cuda
