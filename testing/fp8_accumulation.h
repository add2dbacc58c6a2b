// How Hopper's FP8 tensor cores add (wgmma with e4m3 / e5m2 operands): in reduced precision.
// DeepSeek-V3's report (section 3.3.2) measured the accumulation "limited to retaining around 14
// bits"; SageAttention2 describes a 22-bit accumulator (13 mantissa bits). Modelled here, per
// instruction (32 products, k32): the incoming accumulator and the exact products are aligned to
// the largest one's leading bit, the bits more than kFp8AccumulatorBits below it are dropped
// (truncation toward zero), and the rest is summed. The hardware's exact truncation point is not
// documented: kernels are checked against this model, not against its bits. Used by the SM90
// emulator's wgmma (tests/cuda/emulator/sm90_emulator.h) and by the tolerance baseline's FP8 scores
// (baseline.cc), so that a kernel and its bound see the same arithmetic.
#pragma once

namespace kvattn::testing {

inline constexpr int kFp8AccumulatorBits = 13;

// c + sum_{i < k} a[i] b[i] (k <= 32) in that reduced precision; inf / NaN and all-zero sums as
// exact arithmetic gives them.
float fp8_mma_sum(float c, const float* a, const float* b, int k);

}  // namespace kvattn::testing
