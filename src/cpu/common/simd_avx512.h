// AVX-512 vector helpers for the CPU kernels (16 f32 lanes). Include only from files compiled
// with the AVX-512 flags (-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c).
//
// Stored K/V elements load as f32 "raw" values: real = raw * raw_to_real<T>() * tensor scale.
// The raw factor exists because e4m3 is widened by bit placement into an f16 (see load_e4m3)
// and lands 2^-8 below its value; folding 2^8 into a per-tile scalar is cheaper than a multiply
// per element.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/common/convert_row.h"
#include "kvattn/dtype.h"

namespace kvattn::cpu::avx512 {
// Internal linkage on purpose: every file that includes this is built with its own ISA flags
// (decode, prefill, the MLA kernels with BF16/AMX on top), and an inline function shared by
// name between them could be linked from the file with the widest flags into code that must
// run without them.
namespace {

// r[i] becomes column i of the 16 x 16 matrix of 32-bit words whose row i was r[i]: unpacks of
// words, then of word pairs, then two rounds of 128-bit lane shuffles. Always inline: left out of
// line (GCC 12 did so in prefill_amx.cc), its unpacks' _mm512_undefined_* warn as uninitialized.
[[gnu::always_inline]] inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // r[4g + c], 128-bit lane k: column 4k + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);           // lanes 0, 2
    t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);       // lanes 1, 3
    t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);  // lanes 0, 2
    t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
  }
}

struct Simd {
  static constexpr int kWidth = 16;
  using Vec = __m512;

  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  // max/min return b when either is NaN, so max(limit, x) keeps a NaN x.
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
  static float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }

  // parts[i] holds partial sums of dot product i; returns lane i = sum of parts[i]'s lanes.
  // In two stages, so that a caller may reduce its dot products four at a time as they come
  // (decode's head steps, decode_fma_tiles.h): reduce_four(parts + 4m) for m = 0..3, then
  // reduce_fours of the four results.
  static Vec reduce_rows(const Vec* parts) {
    const Vec fours[4] = {reduce_four(parts), reduce_four(parts + 4), reduce_four(parts + 8),
                          reduce_four(parts + 12)};
    return reduce_fours(fours);
  }
  // Four dot products' partial sums to one vector: lane 4L + i holds a partial sum of parts[i].
  static Vec reduce_four(const Vec* parts) {
    const Vec pair0 = _mm512_add_ps(_mm512_unpacklo_ps(parts[0], parts[1]),
                                    _mm512_unpackhi_ps(parts[0], parts[1]));
    const Vec pair1 = _mm512_add_ps(_mm512_unpacklo_ps(parts[2], parts[3]),
                                    _mm512_unpackhi_ps(parts[2], parts[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(pair0, pair1, 0x44),
                         _mm512_shuffle_ps(pair0, pair1, 0xEE));
  }
  // Four reduce_four results (dot products 4m .. 4m + 3 in fours[m]) to lane i = dot product i.
  static Vec reduce_fours(const Vec* fours) {
    Vec half[2];
    for (int i = 0; i < 2; ++i) {
      half[i] = _mm512_add_ps(_mm512_shuffle_f32x4(fours[2 * i], fours[2 * i + 1], 0x88),
                              _mm512_shuffle_f32x4(fours[2 * i], fours[2 * i + 1], 0xDD));
    }
    return _mm512_add_ps(_mm512_shuffle_f32x4(half[0], half[1], 0x88),
                         _mm512_shuffle_f32x4(half[0], half[1], 0xDD));
  }

  // 2^x: Cephes' exp2f polynomial on [-0.5, 0.5] (relative error ~2e-7), scaled by 2^round(x).
  // Exactly 0 below -125 (and for -inf), so masked keys add nothing and no f32 denormal (a
  // microcode assist on Intel cores in every FMA that touches it) is made; NaN -> NaN. The one
  // exp2 of the AVX-512 kernels: decode and prefill both call it.
  static Vec exp2(Vec x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, set1(-125.0f), _CMP_LT_OQ);
    // Bounds first: max/min return the second operand when either is NaN, so a NaN x stays.
    x = _mm512_min_ps(set1(127.0f), _mm512_max_ps(set1(-125.0f), x));
    const Vec n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Vec f = _mm512_sub_ps(x, n);
    Vec p = set1(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, set1(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, set1(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, set1(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, set1(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, set1(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, set1(1.0f));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n);
  }

  // tanh: Cephes' odd polynomial below 0.625 (where 1 - e^-2|x| would cancel: a soft cap c
  // multiplies that absolute error by c), 1 - 2 / (e^(2|x|) + 1) above; sign restored; NaN ->
  // NaN. The one tanh of the AVX-512 kernels (a second copy once lost NaN scores).
  static Vec tanh(Vec x) {
    const Vec sign = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
    const Vec ax = _mm512_abs_ps(x);
    const Vec z = _mm512_mul_ps(x, x);
    Vec p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
    const Vec small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    // min(60, .) with the product second keeps a NaN score NaN.
    const Vec e = exp2(_mm512_min_ps(_mm512_set1_ps(60.0f),
                                     _mm512_mul_ps(ax, _mm512_set1_ps(2.8853900817779268f))));
    const Vec one = _mm512_set1_ps(1.0f);
    const Vec large = _mm512_or_ps(
        _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one))), sign);
    const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(is_small, large, small);
  }

  // Rounded to the nearest f16 (even on ties), as f32.
  static Vec round_f16(Vec x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Lane i = base + i.
  static Vec iota(float base) {
    return _mm512_add_ps(_mm512_set1_ps(base),
                         _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  // Lanes whose byte in `keep` (16 bytes, 0 or not) is 0 become -inf.
  static Vec mask_by_bytes(Vec v, const uint8_t* keep) {
    const __mmask16 visible = _mm_test_epi8_mask(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(keep)), _mm_set1_epi8(-1));
    return _mm512_mask_mov_ps(_mm512_set1_ps(-__builtin_inff()), visible, v);
  }

  template <DType T>
  static constexpr float raw_to_real() {
    return T == DType::kE4M3 ? 256.0f : 1.0f;
  }

  // kWidth stored elements of type T at p, as raw f32 (see the file comment).
  // Widening of loaded integer lanes, shared with the prefill kernels (which load with masks).
  // 16 bf16 -> f32, exact.
  static Vec widen_bf16(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  // 16 e5m2 codes -> f16 bits, exact: e5m2 is the top byte of an f16 of the same bias.
  static __m256i e5m2_as_f16(__m128i codes) {
    return _mm256_slli_epi16(_mm256_cvtepu8_epi16(codes), 8);
  }
  // 16 e4m3 codes -> f16 bits of value * 2^-8, exact (see load_e4m3); the NaN code reads 480.
  static __m256i e4m3_as_f16(__m128i codes) {
    const __m256i x = _mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7);
    return _mm256_and_si256(x, _mm256_set1_epi16(int16_t(0xBF80u)));
  }
  // Lanes holding the e4m3 NaN code S.1111.111.
  static __mmask16 e4m3_nan_lanes(__m128i codes) {
    return _mm_cmpeq_epi8_mask(_mm_or_si128(codes, _mm_set1_epi8(static_cast<char>(0x80))),
                               _mm_set1_epi8(-1));
  }

  template <DType T>
  static Vec load_raw(const void* p) {
    if constexpr (T == DType::kF32) {
      return _mm512_loadu_ps(p);
    } else if constexpr (T == DType::kF16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    } else if constexpr (T == DType::kBF16) {
      return widen_bf16(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    } else if constexpr (T == DType::kE4M3) {
      return load_e4m3(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    } else {
      static_assert(T == DType::kE5M2);
      return _mm512_cvtph_ps(e5m2_as_f16(_mm_loadu_si128(static_cast<const __m128i*>(p))));
    }
  }
  // The first n (< kWidth) elements, the other lanes 0.
  template <DType T>
  static Vec load_raw_tail(const void* p, int n) {
    alignas(64) unsigned char buffer[64] = {};
    std::memcpy(buffer, p, static_cast<std::size_t>(n) * dtype_size(T));
    return load_raw<T>(buffer);
  }
  static Vec load_tail(const float* p, int n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
  }
  static void store_tail(float* p, Vec v, int n) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
  }

  // 16 e4m3 codes -> f32 of value * 2^-8: the sign to bit 15 and the 7 exponent-mantissa bits
  // to bits 13..7 of an f16, whose exponent bias (15) is 8 above e4m3's (7), then the f16 -> f32
  // conversion. Subnormal codes become f16 subnormals, exact, and every result is a normal f32:
  // placing the bits straight into an f32 (2^-120 below the value) made f32 denormals of the
  // small codes, and on Intel cores every FMA touching one takes a microcode assist (decode ran
  // 15x slower on e4m3 than on bf16). The NaN code (S.1111.111) is not distinguished here (it
  // reads as 480): callers that must see it use has_e4m3_nan_rows.
  static Vec load_e4m3(__m128i codes) { return _mm512_cvtph_ps(e4m3_as_f16(codes)); }
  // Whether any of the first n bytes of `count` rows (those with visible[r] != 0, or all where
  // visible is null) is an e4m3 NaN code (as simd_avx2.h's: the bytewise maximum of the codes
  // with their sign bit set is 0xFF exactly when one is there).
  static bool has_e4m3_nan_rows(const std::byte* const* rows, int count, const uint8_t* visible,
                                int64_t n) {
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i top = _mm512_setzero_si512();
    bool found = false;
    const int64_t full = n / 64 * 64;
    for (int r = 0; r < count; ++r) {
      if (visible && !visible[r]) continue;
      const auto* bytes = reinterpret_cast<const uint8_t*>(rows[r]);
      for (int64_t i = 0; i < full; i += 64) {
        top = _mm512_max_epu8(top, _mm512_or_si512(_mm512_loadu_si512(bytes + i), sign));
      }
      for (int64_t i = full; i < n; ++i) found |= (bytes[i] & 0x7F) == 0x7F;
    }
    return found || _mm512_cmpeq_epi8_mask(top, _mm512_set1_epi8(-1)) != 0;
  }

  // Loads 16 values of f16/bf16/e4m3/e5m2/f32 at p as real f32 times `scale`.
  template <DType T>
  static Vec load_scaled(const void* p, float scale) {
    Vec raw = load_raw<T>(p);
    if constexpr (T == DType::kE4M3) raw = _mm512_mul_ps(raw, _mm512_set1_ps(raw_to_real<T>()));
    return _mm512_mul_ps(raw, _mm512_set1_ps(scale));
  }

  // Row conversions, shared by the prefill kernels (K/V staging, the output) and the decode
  // kernels (the queries, the output): convert_row<T> reads n stored elements as real f32 times
  // `scale` (convert_row_as_f32 picks T at run time), store_convert writes n f32 values in the
  // output's dtype (f32, f16 or bf16, rounded to nearest even), both at unit stride.
  // 16 stored elements (those set in `m`) as f32, before the scale and before raw_to_real<T>().
  template <DType T>
  static Vec load16(const unsigned char* src, __mmask16 m) {
    if constexpr (T == DType::kF32) {
      return _mm512_maskz_loadu_ps(m, src);
    } else if constexpr (T == DType::kF16) {
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src));
    } else if constexpr (T == DType::kBF16) {
      return widen_bf16(_mm256_maskz_loadu_epi16(m, src));
    } else if constexpr (T == DType::kE5M2) {
      return _mm512_cvtph_ps(e5m2_as_f16(_mm_maskz_loadu_epi8(m, src)));
    } else {
      // e4m3 bits moved into an f16 (a factor 2^-8, see raw_to_real); S.1111.111 is NaN.
      const __m128i codes = _mm_maskz_loadu_epi8(m, src);
      return _mm512_mask_blend_ps(e4m3_nan_lanes(codes), load_e4m3(codes),
                                  set1(__builtin_nanf("")));
    }
  }

  template <DType T>
  static void convert_row(const unsigned char* src, int n, float scale, float* dst) {
    constexpr int esize = T == DType::kF32 ? 4 : (T == DType::kF16 || T == DType::kBF16) ? 2 : 1;
    const Vec s = set1(scale * raw_to_real<T>());
    int i = 0;
    for (; i + kWidth <= n; i += kWidth) store(dst + i, mul(load16<T>(src + i * esize, 0xffff), s));
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps(dst + i, m, mul(load16<T>(src + i * esize, m), s));
    }
  }

  static void store16(Vec x, DType dtype, __mmask16 m, unsigned char* dst) {
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
    for (; i + kWidth <= n; i += kWidth) store16(load(src + i), dtype, 0xffff, bytes + i * esize);
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      store16(_mm512_maskz_loadu_ps(m, src + i), dtype, m, bytes + i * esize);
    }
  }
};

}  // namespace
}  // namespace kvattn::cpu::avx512
