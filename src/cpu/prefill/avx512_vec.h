// The AVX-512 (F, BW, VL, DQ) vector type of the prefill kernels: 16 f32 lanes, 32 registers.
// Included inside the namespace of each file built with the AVX-512 flags (prefill_avx512.cc,
// prefill_avx512_bf16.cc), never from code built without them. Needs <immintrin.h> and
// cpu/simd_avx512.h (included at the top of the file, outside its namespace).

// The basic operations (zero, load, store, set1, fma, mul, add, sub, max), exp2, tanh,
// round_f16 and the widening conversions are the AVX-512 helpers the decode kernels use too
// (simd_avx512.h), written once.
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

  // 16 stored elements (those set in `m`) as f32, before the scale and before raw_to_real<T>().
  template <DType T>
  static Reg load16(const unsigned char* src, __mmask16 m) {
    if constexpr (T == DType::kF32) {
      return _mm512_maskz_loadu_ps(m, src);
    } else if constexpr (T == DType::kF16) {
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src));
    } else if constexpr (T == DType::kBF16) {
      return Simd::widen_bf16(_mm256_maskz_loadu_epi16(m, src));
    } else if constexpr (T == DType::kE5M2) {
      return _mm512_cvtph_ps(Simd::e5m2_as_f16(_mm_maskz_loadu_epi8(m, src)));
    } else {
      // e4m3 bits moved into an f16 (a factor 2^-8, see raw_to_real); S.1111.111 is NaN.
      const __m128i codes = _mm_maskz_loadu_epi8(m, src);
      return _mm512_mask_blend_ps(Simd::e4m3_nan_lanes(codes), Simd::load_e4m3(codes),
                                  set1(__builtin_nanf("")));
    }
  }

  template <DType T>
  static void convert_row(const unsigned char* src, int n, float scale, float* dst) {
    constexpr int esize = T == DType::kF32 ? 4 : (T == DType::kF16 || T == DType::kBF16) ? 2 : 1;
    const Reg s = set1(scale * raw_to_real<T>());
    int i = 0;
    for (; i + W <= n; i += W) store(dst + i, mul(load16<T>(src + i * esize, 0xffff), s));
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps(dst + i, m, mul(load16<T>(src + i * esize, m), s));
    }
  }

  static void store16(const Reg x, DType dtype, __mmask16 m, unsigned char* dst) {
    switch (dtype) {
      case DType::kF32:
        _mm512_mask_storeu_ps(dst, m, x);
        return;
      case DType::kF16:
        _mm256_mask_storeu_epi16(dst, m,
                                 _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        return;
      case DType::kBF16: {
        // Round to nearest even on the bits; NaN stays a quiet NaN.
        const __m512i u = _mm512_castps_si512(x);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
        const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        const __m512i bits = _mm512_mask_blend_epi32(nan, rounded, quiet);
        _mm256_mask_storeu_epi16(dst, m, _mm512_cvtepi32_epi16(bits));
        return;
      }
      default:
        return;
    }
  }

  static void store_convert(const float* src, int n, DType dtype, void* dst) {
    auto* bytes = static_cast<unsigned char*>(dst);
    const int esize = dtype == DType::kF32 ? 4 : 2;
    int i = 0;
    for (; i + W <= n; i += W) store16(load(src + i), dtype, 0xffff, bytes + i * esize);
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      store16(_mm512_maskz_loadu_ps(m, src + i), dtype, m, bytes + i * esize);
    }
  }
};
