// The AVX-512 (F, BW, VL, DQ) vector type of the prefill kernels: 16 f32 lanes, 32 registers.
// Included inside the namespace of each file built with the AVX-512 flags (prefill_avx512.cc,
// prefill_avx512_bf16.cc), never from code built without them. Needs <immintrin.h> and
// cpu/simd_avx512.h (included at the top of the file, outside its namespace).

// The basic operations (zero, load, store, set1, fma, mul, add, sub, max), exp2, tanh,
// round_f16 and the row conversions (convert_row, store_convert) are the AVX-512 helpers the
// decode kernels use too (simd_avx512.h), written once.
struct Vec : ::kvattn::cpu::avx512::Simd {
  using Reg = __m512;
  static constexpr int W = 16;
  // 4 row vectors (64 query rows) x 6 keys = 24 accumulators, 4 row loads and 6 broadcasts per
  // step: two FMA pipes stay fed from two load ports, with registers to spare.
  static constexpr int kRowVecs = 4;
  static constexpr int kKeyBlock = 6;
  static constexpr int kDvBlock = 6;

  static bool any_greater(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
  static Reg zero_if_neg_inf(Reg x) {
    const __mmask16 is_neg_inf = _mm512_cmp_ps_mask(x, set1(-__builtin_huge_valf()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(is_neg_inf, x, zero());
  }
};
