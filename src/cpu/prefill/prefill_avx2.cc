// The prefill kernel for AVX2 + FMA + F16C: 8 f32 lanes, 16 registers. Built with only this ISA's
// flags; reached through prefill_item_fn_avx2() when the CPU has it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/prefill/params.h"
#include "cpu/common/simd_avx2.h"

namespace kvattn::cpu::prefill::avx2 {
namespace {

// The basic operations, exp2, tanh, round_f16 and the row conversions (convert_row,
// store_convert) are the AVX2 helpers the decode kernels use too (simd_avx2.h), written once.
struct Vec : ::kvattn::cpu::avx2::Simd {
  using Reg = __m256;
  static constexpr int W = 8;
  // 2 row vectors x 6 keys = 12 accumulators + 2 row loads + 1 broadcast: 15 of 16 registers.
  static constexpr int kRowVecs = 2;
  static constexpr int kKeyBlock = 6;
  static constexpr int kDvBlock = 6;

  static bool any_greater(Reg a, Reg b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0;
  }
  static Reg zero_if_neg_inf(Reg x) {
    const Reg is_neg_inf = _mm256_cmp_ps(x, set1(-__builtin_huge_valf()), _CMP_EQ_OQ);
    return _mm256_andnot_ps(is_neg_inf, x);
  }
};

#include "cpu/prefill/kernel.h"

}  // namespace
}  // namespace kvattn::cpu::prefill::avx2

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx2() { return &avx2::run_item; }
}  // namespace kvattn::cpu::prefill
