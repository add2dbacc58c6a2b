// The prefill kernel for AVX-512 (F, BW, VL, DQ): 16 f32 lanes, 32 registers. Built with only
// this ISA's flags; reached through prefill_item_fn_avx512() when the CPU has it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/prefill/params.h"

namespace kvattn::cpu::prefill::avx512 {
namespace {

struct Vec {
  using Reg = __m512;
  static constexpr int W = 16;
  // 4 row vectors (64 query rows) x 6 keys = 24 accumulators, 4 row loads and 6 broadcasts per
  // step: two FMA pipes stay fed from two load ports, with registers to spare.
  static constexpr int kRowVecs = 4;
  static constexpr int kKeyBlock = 6;
  static constexpr int kDvBlock = 6;

  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static bool any_greater(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
  static Reg zero_if_neg_inf(Reg x) {
    const __mmask16 is_neg_inf = _mm512_cmp_ps_mask(x, set1(-__builtin_huge_valf()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(is_neg_inf, x, zero());
  }

  // 2^x: Cephes' exp2f polynomial on [-0.5, 0.5] (relative error ~2e-7), scaled by 2^round(x).
  // Exactly 0 below -125 (and for -inf), so masked keys add nothing.
  static Reg exp2(Reg x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, set1(-125.0f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, set1(-125.0f)), set1(127.0f));
    const Reg n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = sub(x, n);
    Reg p = set1(1.535336188319500e-4f);
    p = fma(p, f, set1(1.339887440266574e-3f));
    p = fma(p, f, set1(9.618437357674640e-3f));
    p = fma(p, f, set1(5.550332471162809e-2f));
    p = fma(p, f, set1(2.402264791363012e-1f));
    p = fma(p, f, set1(6.931472028550421e-1f));
    p = fma(p, f, set1(1.0f));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n);
  }

  // tanh: Cephes' odd polynomial below 0.625, 1 - 2 / (e^(2|x|) + 1) above (no cancellation
  // there), sign restored.
  static Reg tanh(Reg x) {
    const Reg sign = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u))));
    const Reg ax = _mm512_abs_ps(x);
    const Reg z = mul(x, x);
    Reg p = set1(-5.70498872745e-3f);
    p = fma(p, z, set1(2.06390887954e-2f));
    p = fma(p, z, set1(-5.37397155531e-2f));
    p = fma(p, z, set1(1.33314422036e-1f));
    p = fma(p, z, set1(-3.33332819422e-1f));
    const Reg small = fma(mul(p, z), x, x);
    const Reg e = exp2(_mm512_min_ps(mul(ax, set1(2.0f * 1.4426950408889634f)), set1(60.0f)));
    const Reg large = sub(set1(1.0f), _mm512_div_ps(set1(2.0f), add(e, set1(1.0f))));
    const Reg large_signed = _mm512_or_ps(large, sign);
    const __mmask16 is_small = _mm512_cmp_ps_mask(ax, set1(0.625f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(is_small, large_signed, small);
  }

  static Reg round_f16(Reg x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  // 16 stored elements (the first `n`, masked) as f32, before the scale.
  static Reg load16(const unsigned char* src, DType dtype, __mmask16 m, float* extra_scale) {
    *extra_scale = 1.0f;
    switch (dtype) {
      case DType::kF32:
        return _mm512_maskz_loadu_ps(m, src);
      case DType::kF16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src));
      case DType::kBF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src)), 16));
      case DType::kE5M2: {
        // e5m2 is the top byte of an f16.
        const __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, src)), 8);
        return _mm512_cvtph_ps(h);
      }
      case DType::kE4M3: {
        // e4m3 bits moved into an f16 (exponent bias 7 vs 15: a factor 2^8, folded into the
        // scale); subnormals map to f16 subnormals exactly. S.1111.111 is NaN.
        const __m256i x = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, src));
        const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7f));
        const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
        const __m256i h = _mm256_or_si256(sign, _mm256_slli_epi16(mag, 7));
        const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f));
        *extra_scale = 256.0f;
        return _mm512_mask_blend_ps(nan, _mm512_cvtph_ps(h), set1(__builtin_nanf("")));
      }
      default:
        return zero();
    }
  }

  static void load_convert(const void* src, DType dtype, int n, float scale, float* dst) {
    const auto* bytes = static_cast<const unsigned char*>(src);
    const int esize = dtype == DType::kF32                              ? 4
                      : (dtype == DType::kF16 || dtype == DType::kBF16) ? 2
                                                                        : 1;
    int i = 0;
    float extra = 1.0f;
    for (; i + W <= n; i += W) {
      const Reg x = load16(bytes + i * esize, dtype, 0xffff, &extra);
      store(dst + i, mul(x, set1(scale * extra)));
    }
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      const Reg x = load16(bytes + i * esize, dtype, m, &extra);
      _mm512_mask_storeu_ps(dst + i, m, mul(x, set1(scale * extra)));
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

#include "cpu/prefill/kernel.inc"

}  // namespace
}  // namespace kvattn::cpu::prefill::avx512

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx512() { return &avx512::run_item; }
}  // namespace kvattn::cpu::prefill
