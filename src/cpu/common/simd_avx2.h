// AVX2 + FMA vector helpers for the CPU kernels (8 f32 lanes), the same interface as
// simd_avx512.h. Include only from files compiled with -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/common/convert_row.h"
#include "kvattn/dtype.h"

namespace kvattn::cpu::avx2 {
// Internal linkage on purpose: every file that includes this is built with its own ISA flags
// (decode, prefill, the MLA kernels with BF16/AMX on top), and an inline function shared by
// name between them could be linked from the file with the widest flags into code that must
// run without them.
namespace {

struct Simd {
  static constexpr int kWidth = 8;
  using Vec = __m256;

  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
  static float reduce_add(Vec v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static float reduce_max(Vec v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }

  // parts[i] holds partial sums of dot product i; returns lane i = sum of parts[i]'s lanes. In
  // two stages as in simd_avx512.h: reduce_four of parts and of parts + 4, then reduce_fours.
  static Vec reduce_rows(const Vec* parts) {
    const Vec fours[2] = {reduce_four(parts), reduce_four(parts + 4)};
    return reduce_fours(fours);
  }
  // Four dot products' partial sums to one vector: lanes i and 4 + i hold partial sums of
  // parts[i].
  static Vec reduce_four(const Vec* parts) {
    return _mm256_hadd_ps(_mm256_hadd_ps(parts[0], parts[1]), _mm256_hadd_ps(parts[2], parts[3]));
  }
  // Two reduce_four results (dot products 4m .. 4m + 3 in fours[m]) to lane i = dot product i.
  static Vec reduce_fours(const Vec* fours) {
    return _mm256_add_ps(_mm256_permute2f128_ps(fours[0], fours[1], 0x20),
                         _mm256_permute2f128_ps(fours[0], fours[1], 0x31));
  }

  // 2^x as in simd_avx512.h (exactly 0 below -125, no denormals, NaN -> NaN); the power of two
  // is built in the exponent bits, in two halves so that the p < 1, n = -125 corner stays a
  // normal number. The one exp2 of the AVX2 kernels: decode and prefill both call it.
  static Vec exp2(Vec x) {
    const Vec tiny = _mm256_cmp_ps(x, set1(-125.0f), _CMP_LT_OQ);
    // Bounds first: max/min return the second operand when either is NaN, so a NaN x stays.
    x = _mm256_min_ps(set1(127.0f), _mm256_max_ps(set1(-125.0f), x));
    const Vec n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Vec f = _mm256_sub_ps(x, n);
    Vec p = set1(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, set1(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, set1(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, set1(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, set1(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, set1(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, set1(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half1 = _mm256_srai_epi32(ni, 1);
    const __m256i half2 = _mm256_sub_epi32(ni, half1);
    const Vec s1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half1, _mm256_set1_epi32(127)), 23));
    const Vec s2 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half2, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
  }

  // tanh: Cephes' odd polynomial below 0.625 (where 1 - e^-2|x| would cancel: a soft cap c
  // multiplies that absolute error by c), 1 - 2 / (e^(2|x|) + 1) above; sign restored.
  static Vec tanh(Vec x) {
    const Vec sign = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)));
    const Vec ax = _mm256_andnot_ps(sign, x);
    const Vec z = _mm256_mul_ps(x, x);
    Vec p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    const Vec small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    // min(60, .) with the product second keeps a NaN score NaN.
    const Vec e = exp2(_mm256_min_ps(_mm256_set1_ps(60.0f),
                                     _mm256_mul_ps(ax, _mm256_set1_ps(2.8853900817779268f))));
    const Vec one = _mm256_set1_ps(1.0f);
    const Vec large = _mm256_or_ps(
        _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one))), sign);
    const Vec is_small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ);
    return _mm256_blendv_ps(large, small, is_small);
  }

  static Vec round_f16(Vec x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static Vec iota(float base) {
    return _mm256_add_ps(_mm256_set1_ps(base), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vec mask_by_bytes(Vec v, const uint8_t* keep) {
    int64_t bytes8;
    std::memcpy(&bytes8, keep, 8);
    const __m256i k = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes8));
    const __m256 hidden = _mm256_castsi256_ps(_mm256_cmpeq_epi32(k, _mm256_setzero_si256()));
    return _mm256_blendv_ps(v, _mm256_set1_ps(-__builtin_inff()), hidden);
  }

  template <DType T>
  static constexpr float raw_to_real() {
    return T == DType::kE4M3 ? 256.0f : 1.0f;
  }

  // Widening of loaded integer lanes, shared with the prefill kernels. 8 bf16 -> f32, exact.
  static Vec widen_bf16(__m128i bits) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
  // 8 e5m2 codes (low 8 bytes) -> f16 bits, exact.
  static __m128i e5m2_as_f16(__m128i codes) { return _mm_slli_epi16(_mm_cvtepu8_epi16(codes), 8); }
  // 8 e4m3 codes (low 8 bytes) -> f16 bits of value * 2^-8, exact; the NaN code reads 480.
  static __m128i e4m3_as_f16(__m128i codes) {
    const __m128i x = _mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7);
    return _mm_and_si128(x, _mm_set1_epi16(int16_t(0xBF80u)));
  }
  // All-ones f32 lanes where the code is the e4m3 NaN S.1111.111.
  static Vec e4m3_nan_lanes(__m128i codes) {
    const __m128i nan = _mm_cmpeq_epi8(_mm_or_si128(codes, _mm_set1_epi8(static_cast<char>(0x80))),
                                       _mm_set1_epi8(-1));
    return _mm256_castsi256_ps(_mm256_cvtepi8_epi32(nan));
  }

  template <DType T>
  static Vec load_raw(const void* p) {
    if constexpr (T == DType::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(p));
    } else if constexpr (T == DType::kF16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    } else if constexpr (T == DType::kBF16) {
      return widen_bf16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    } else if constexpr (T == DType::kE4M3) {
      // As in simd_avx512.h: the bits placed in an f16 (2^-8 below the value, never an f32
      // denormal).
      return _mm256_cvtph_ps(e4m3_as_f16(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
    } else {
      static_assert(T == DType::kE5M2);
      return _mm256_cvtph_ps(e5m2_as_f16(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
    }
  }
  // 16 FP8 values at p (two vectors' worth) as raw f32, widened together: one sign extension,
  // shift and mask for both halves where load_raw takes one each (the AVX2 decode kernel on Zen
  // 5, cache-resident: e4m3 d128 1.05x, e5m2 1.04x, e4m3 d64 level).
  template <DType T>
  requires(T == DType::kE4M3 || T == DType::kE5M2) static void load_raw_pair(const void* p, Vec* lo,
                                                                             Vec* hi) {
    const __m128i codes = _mm_loadu_si128(static_cast<const __m128i*>(p));
    __m256i bits;
    if constexpr (T == DType::kE4M3) {
      bits = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7),
                              _mm256_set1_epi16(int16_t(0xBF80u)));
    } else {
      bits = _mm256_slli_epi16(_mm256_cvtepu8_epi16(codes), 8);
    }
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(bits));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1));
  }
  // 16 floats at x into parity order (x0, x2, .., x14, then x1, x3, .., x15) and back, in place:
  // the queries and the output accumulators of load_bf16_parity's rows.
  static void to_parity(float* x) {
    const Vec a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
    // shuffle_ps takes each 128-bit lane's even (odd) values of a then b; the permute puts a's
    // four before b's.
    const Vec even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    const Vec odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    _mm256_storeu_ps(x, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8)));
    _mm256_storeu_ps(x + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xD8)));
  }
  static void from_parity(float* x) {
    const Vec even = _mm256_loadu_ps(x), odd = _mm256_loadu_ps(x + 8);
    const Vec lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    _mm256_storeu_ps(x, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(x + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  // v made to live in a register (an empty asm that claims to change it), for a vector that
  // several FMAs use: GCC otherwise folds its load into each of them, one load per FMA.
  static void in_register(Vec& v) { asm("" : "+x"(v)); }
  // 16 bf16 values at p as two f32 vectors by parity, exact: the even-indexed values (the low
  // word of each 32-bit lane, shifted up) and the odd-indexed ones (the high word, masked): one
  // load and two ALU operations where load_raw takes a widening load and a shift for each vector.
  // The decode kernel's fp32-FMA tiles read 16-bit rows so on AVX2 (decode_fma_blocks.h: q and the
  // output accumulators are stored in the same order).
  static void load_bf16_parity(const void* p, Vec* even, Vec* odd) {
    const __m256i w = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
  }
  // 32 e4m3 codes at p by quads: vector k (k = 0..3) holds codes k, k + 4, .., k + 28, half is
  // 0 for quads 0 and 1, 1 for quads 2 and 3. Each code's bits placed in an f32 (its sign at bit
  // 31, exponent and mantissa at bits 26..20): 2^-120 of its value, exact, codes of exponent 0 as
  // f32 denormals (exact only where the MXCSR's DAZ is clear); the NaN code S.1111.111 reads
  // 480 * 2^-120. Shifts and masks only, one load a half: no f16 conversion (load_raw_pair's
  // sign extension, shift, mask and two vcvtph2ps a 16 codes; on Zen 3 a loop of 8 FMAs a 16
  // codes took 1.27-1.45x the FMAs' time with those, 1.02-1.07x with these). The decode kernel's
  // fp32-FMA QK and PV read e4m3 rows so on AVX2 (decode_fma_blocks.h, kQuadRows).
  template <int kHalf>
  static void load_e4m3_quads(const void* p, Vec* a, Vec* b) {
    e4m3_quads<kHalf>(_mm256_loadu_si256(static_cast<const __m256i*>(p)), a, b);
  }
  // The same, also folding the 32 codes into *nan_probe (start from zero(); e4m3_nan_probed then
  // tells whether one of the codes folded in was the NaN code S.1111.111): the bytewise maximum
  // of the codes with their sign bit set, 0xFF exactly where one was (as has_e4m3_nan_rows
  // scans), two ALU operations a 32 codes on bytes the loop has in a register anyway.
  template <int kHalf>
  static void load_e4m3_quads(const void* p, Vec* a, Vec* b, Vec* nan_probe) {
    const __m256i w = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    const __m256i signed_codes = _mm256_or_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
    *nan_probe = _mm256_castsi256_ps(
        _mm256_max_epu8(_mm256_castps_si256(*nan_probe), signed_codes));
    e4m3_quads<kHalf>(w, a, b);
  }
  static bool e4m3_nan_probed(Vec nan_probe) {
    const __m256i all = _mm256_cmpeq_epi8(_mm256_castps_si256(nan_probe), _mm256_set1_epi8(-1));
    return _mm256_movemask_epi8(all) != 0;
  }
  template <int kHalf>
  static void e4m3_quads(__m256i w, Vec* a, Vec* b) {
    const __m256i keep = _mm256_set1_epi32(int32_t(0x87F00000u));
    // Lane byte j in bits 31..24, moved down 4 with its sign repeated above, the repeats cleared.
    auto quad = [&](__m256i top) {
      return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(top, 4), keep));
    };
    if constexpr (kHalf == 0) {
      *a = quad(_mm256_slli_epi32(w, 24));
      *b = quad(_mm256_slli_epi32(w, 16));
    } else {
      *a = quad(_mm256_slli_epi32(w, 8));
      *b = quad(w);
    }
  }
  // Runs f() with the MXCSR's DAZ flag clear, restored after: load_e4m3_quads' denormals are
  // inputs that a host which set DAZ (e.g. torch.set_flush_denormal(True)) would read as zero.
  // (One call of f, inlined: the decode tiles' loops run inside it.)
  template <class F>
  [[gnu::always_inline]] static void with_denormal_inputs(F&& f) {
    const unsigned csr = _mm_getcsr();
    constexpr unsigned kDaz = 1u << 6;
    const bool daz = (csr & kDaz) != 0;
    if (daz) _mm_setcsr(csr & ~kDaz);
    f();
    if (daz) _mm_setcsr(csr);
  }
  // 32 floats at x from quad order (the 8 values of quad k at x + 8k: columns k, k + 4, ..) back
  // to column order, in place: the output accumulators of load_e4m3_quads' rows.
  static void from_quads(float* x) {
    alignas(32) float t[32];
    std::memcpy(t, x, sizeof(t));
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 8; ++i) x[4 * i + k] = t[8 * k + i];
    }
  }
  // The inverse: 32 floats at x into quad order, in place (the queries of load_e4m3_quads' rows).
  static void to_quads(float* x) {
    alignas(32) float t[32];
    std::memcpy(t, x, sizeof(t));
    for (int k = 0; k < 4; ++k) {
      for (int i = 0; i < 8; ++i) x[8 * k + i] = t[4 * i + k];
    }
  }
  // Where column d of a row of 32-column blocks is kept in quad order.
  static constexpr int quad_position(int d) { return d / 32 * 32 + (d % 4) * 8 + d % 32 / 4; }
  template <DType T>
  static Vec load_raw_tail(const void* p, int n) {
    alignas(32) unsigned char buffer[32] = {};
    std::memcpy(buffer, p, static_cast<std::size_t>(n) * dtype_size(T));
    return load_raw<T>(buffer);
  }
  static Vec load_tail(const float* p, int n) {
    alignas(32) float buffer[8] = {};
    std::memcpy(buffer, p, static_cast<std::size_t>(n) * sizeof(float));
    return _mm256_load_ps(buffer);
  }
  static void store_tail(float* p, Vec v, int n) {
    alignas(32) float buffer[8];
    _mm256_store_ps(buffer, v);
    std::memcpy(p, buffer, static_cast<std::size_t>(n) * sizeof(float));
  }

  // Whether any of the first n bytes of `count` rows (those with visible[r] != 0, or all where
  // visible is null) is an e4m3 NaN code: with the sign bit set, a NaN code is the byte 0xFF, so
  // the bytewise maximum of the rows is 0xFF exactly when one is there (one OR and one max per 32
  // bytes, one compare at the end).
  static bool has_e4m3_nan_rows(const std::byte* const* rows, int count, const uint8_t* visible,
                                int64_t n) {
    const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256i top = _mm256_setzero_si256(), top2 = top;
    bool found = false;
    const int64_t pairs = n / 64 * 64, full = n / 32 * 32;
    auto codes = [](const uint8_t* p) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    };
    for (int r = 0; r < count; ++r) {
      if (visible && !visible[r]) continue;
      const auto* bytes = reinterpret_cast<const uint8_t*>(rows[r]);
      // 64 bytes a step, two maxima (a step of 32 left the loop's overhead in the scan's time).
      for (int64_t i = 0; i < pairs; i += 64) {
        top = _mm256_max_epu8(top, _mm256_or_si256(codes(bytes + i), sign));
        top2 = _mm256_max_epu8(top2, _mm256_or_si256(codes(bytes + i + 32), sign));
      }
      if (full > pairs) top = _mm256_max_epu8(top, _mm256_or_si256(codes(bytes + pairs), sign));
      for (int64_t i = full; i < n; ++i) found |= (bytes[i] & 0x7F) == 0x7F;
    }
    top = _mm256_max_epu8(top, top2);
    return found || _mm256_movemask_epi8(_mm256_cmpeq_epi8(top, _mm256_set1_epi8(-1))) != 0;
  }

  template <DType T>
  static Vec load_scaled(const void* p, float scale) {
    Vec raw = load_raw<T>(p);
    if constexpr (T == DType::kE4M3) raw = _mm256_mul_ps(raw, _mm256_set1_ps(raw_to_real<T>()));
    return _mm256_mul_ps(raw, _mm256_set1_ps(scale));
  }

  // Row conversions, shared by the prefill kernels (K/V staging, the output) and the decode
  // kernels (the queries, the output): convert_row<T> reads n stored elements as real f32 times
  // `scale` (convert_row_as_f32 picks T at run time), store_convert writes n f32 values in the
  // output's dtype (f32, f16 or bf16, rounded to nearest even), both at unit stride.
  // 8 stored elements at src as f32, before the scale and before raw_to_real<T>().
  template <DType T>
  static Vec load8(const unsigned char* src) {
    if constexpr (T == DType::kE4M3) {
      // e4m3 bits placed in an f16 (2^-8 off, see raw_to_real); S.1111.111 is NaN.
      const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
      return _mm256_blendv_ps(_mm256_cvtph_ps(e4m3_as_f16(codes)), set1(__builtin_nanf("")),
                              e4m3_nan_lanes(codes));
    } else {
      return load_raw<T>(src);
    }
  }

  template <DType T>
  static void convert_row(const unsigned char* src, int n, float scale, float* dst) {
    constexpr int esize = T == DType::kF32 ? 4 : (T == DType::kF16 || T == DType::kBF16) ? 2 : 1;
    const Vec s = set1(scale * raw_to_real<T>());
    int i = 0;
    for (; i + kWidth <= n; i += kWidth) store(dst + i, mul(load8<T>(src + i * esize), s));
    if (i < n) {
      // The tail through a zeroed staging buffer: never reads past the row.
      alignas(32) unsigned char staged[kWidth * 4] = {};
      std::memcpy(staged, src + i * esize, (n - i) * esize);
      store_tail(dst + i, mul(load8<T>(staged), s), n - i);
    }
  }

  static void store8(Vec x, DType dtype, unsigned char* dst) {
    switch (dtype) {
      case DType::kF32:
        _mm256_storeu_ps(reinterpret_cast<float*>(dst), x);
        return;
      case DType::kF16:
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        return;
      case DType::kBF16: {
        const __m256i u = _mm256_castps_si256(x);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
        const __m128i packed =
            _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
        return;
      }
      default:
        return;
    }
  }

  static void store_convert(const float* src, int n, DType dtype, void* dst) {
    auto* bytes = static_cast<unsigned char*>(dst);
    const int esize = dtype == DType::kF32 ? 4 : 2;  // the output dtypes: f32, f16, bf16
    int i = 0;
    for (; i + kWidth <= n; i += kWidth) store8(load(src + i), dtype, bytes + i * esize);
    if (i < n) {
      alignas(32) unsigned char staged[kWidth * 4];
      store8(load_tail(src + i, n - i), dtype, staged);
      std::memcpy(bytes + i * esize, staged, (n - i) * esize);
    }
  }
};

}  // namespace
}  // namespace kvattn::cpu::avx2
