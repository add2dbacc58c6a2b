// The prefill kernel for AVX2 + FMA + F16C: 8 f32 lanes, 16 registers. Built with only this ISA's
// flags; reached through prefill_item_fn_avx2() when the CPU has it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/prefill/params.h"
#include "cpu/common/simd_avx2.h"

namespace kvattn::cpu::prefill::avx2 {
namespace {

// The basic operations, exp2, tanh, round_f16 and the widening conversions are the AVX2 helpers
// the decode kernels use too (simd_avx2.h), written once.
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

  // 8 stored elements at src as f32, before the scale and before raw_to_real<T>().
  template <DType T>
  static Reg load8(const unsigned char* src) {
    if constexpr (T == DType::kE4M3) {
      // e4m3 bits placed in an f16 (2^-8 off, see raw_to_real); S.1111.111 is NaN.
      const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
      return _mm256_blendv_ps(_mm256_cvtph_ps(Simd::e4m3_as_f16(codes)),
                              set1(__builtin_nanf("")), Simd::e4m3_nan_lanes(codes));
    } else {
      return load_raw<T>(src);
    }
  }

  template <DType T>
  static void convert_row(const unsigned char* src, int n, float scale, float* dst) {
    constexpr int esize = T == DType::kF32 ? 4 : (T == DType::kF16 || T == DType::kBF16) ? 2 : 1;
    const Reg s = set1(scale * raw_to_real<T>());
    int i = 0;
    for (; i + W <= n; i += W) store(dst + i, mul(load8<T>(src + i * esize), s));
    if (i < n) {
      // The tail through a zeroed staging buffer: never reads past the row.
      alignas(32) unsigned char staged[W * 4] = {};
      std::memcpy(staged, src + i * esize, (n - i) * esize);
      store_tail(dst + i, mul(load8<T>(staged), s), n - i);
    }
  }

  static void store8(Reg x, DType dtype, unsigned char* dst) {
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
    for (; i + W <= n; i += W) store8(load(src + i), dtype, bytes + i * esize);
    if (i < n) {
      alignas(32) unsigned char staged[W * 4];
      store8(load_tail(src + i, n - i), dtype, staged);
      std::memcpy(bytes + i * esize, staged, (n - i) * esize);
    }
  }
};

#include "cpu/prefill/kernel.h"

}  // namespace
}  // namespace kvattn::cpu::prefill::avx2

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_avx2() { return &avx2::run_item; }
}  // namespace kvattn::cpu::prefill
