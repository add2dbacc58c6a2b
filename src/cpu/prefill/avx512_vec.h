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
  // r[i] becomes column i of the 16 x 16 matrix whose row i was r[i] (kernel.h's transposes).
  [[gnu::always_inline]] static void transpose(Reg r[16]) {
    __m512i x[16];
    for (int i = 0; i < 16; ++i) x[i] = _mm512_castps_si512(r[i]);
    ::kvattn::cpu::avx512::transpose16(x);
    for (int i = 0; i < 16; ++i) r[i] = _mm512_castsi512_ps(x[i]);
  }

  // 2^x for the probabilities, x = s - max <= 8 (bf16_pairs.h's lazy rescale; 0 or below in
  // kernel.h's softmax): a degree-4 minimax polynomial of 2^f on [-0.5, 0.5] (relative error
  // 2.7e-6 in f32, against P's rounding to a 16-bit or FP8 q's type, 2^-9 for bf16, which the
  // tolerance allows: testing/baseline.h), scaled by 2^round(x); exactly 0 below -125 (no
  // denormal), NaN -> NaN. Two FMAs and a clamp fewer than Simd::exp2 (degree 6, any x), on the
  // softmax's busiest line.
  static Reg exp2_probability(Reg x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, set1(-125.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(set1(-125.0f), x);  // max returns its second operand, x, for a NaN x
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = set1(0.009569989517331123f);
    p = _mm512_fmadd_ps(p, f, set1(0.05591757968068123f));
    p = _mm512_fmadd_ps(p, f, set1(0.240247443318367f));
    p = _mm512_fmadd_ps(p, f, set1(0.6931218504905701f));
    p = _mm512_fmadd_ps(p, f, set1(0.9999992847442627f));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n);
  }
  static Reg zero_if_neg_inf(Reg x) {
    const __mmask16 is_neg_inf = _mm512_cmp_ps_mask(x, set1(-__builtin_huge_valf()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(is_neg_inf, x, zero());
  }
};
