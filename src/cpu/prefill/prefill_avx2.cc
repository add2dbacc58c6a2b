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

  // 2^x for the probabilities, x = s - max <= kRescaleSlack (or NaN): avx512_vec.h's degree-4
  // polynomial (relative error 2.7e-6, for a 16-bit or FP8 q), scaled by one 2^round(x) (x in
  // [-125, 8]: a normal exponent); 0 below -125, NaN -> NaN. 13 operations where Simd::exp2
  // (degree 6, any x, two scales) takes 21.
  static Reg exp2_probability(Reg x) {
    const Reg tiny = _mm256_cmp_ps(x, set1(-125.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(set1(-125.0f), x);  // max returns its second operand, x, for a NaN x
    const Reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = _mm256_sub_ps(x, n);
    Reg p = set1(0.009569989517331123f);
    p = _mm256_fmadd_ps(p, f, set1(0.05591757968068123f));
    p = _mm256_fmadd_ps(p, f, set1(0.240247443318367f));
    p = _mm256_fmadd_ps(p, f, set1(0.6931218504905701f));
    p = _mm256_fmadd_ps(p, f, set1(0.9999992847442627f));
    const __m256i scale =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
  }
  static bool any_greater(Reg a, Reg b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0;
  }
  // r[i] becomes column i of the 8 x 8 matrix whose row i was r[i] (kernel.h's transposes):
  // unpacks of floats, then of float pairs, then the 128-bit halves.
  static void transpose(Reg r[8]) {
    Reg t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
      u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
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
