// e4m3 -> bf16 for the MLA tile kernels, by integer bit placement (exact: every e4m3 value is a
// bf16 value). Placing the bits straight into an f32 (2^-120 below the value) made f32 denormals
// of the small codes, and each cost a microcode assist in the rescaling multiply: on the
// DeepSeek bench the fp8 tile copy took longer than the tile's dot products.
// Include only from files compiled with the AVX-512 (BW) flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kvattn::cpu {

// n codes at src (n % 16 == 0) to bf16 bits at dst; the NaN code (S.1111.111) becomes NaN.
inline void e4m3_to_bf16(const uint8_t* src, int n, uint16_t* dst) {
  // Subnormal codes m * 2^-9 (m = 0..7) as bf16; the other lanes of the table are unused.
  alignas(64) static constexpr uint16_t kSubnormal[32] = {0x0000, 0x3B00, 0x3B80, 0x3BC0,
                                                          0x3C00, 0x3C20, 0x3C40, 0x3C60};
  const __m512i table = _mm512_load_si512(kSubnormal);
  const __m512i mag_mask = _mm512_set1_epi16(0x7F);
  const __m512i bias = _mm512_set1_epi16(0x3C00);  // (127 - 7) << 7: the exponent rebiased
  const __m512i nan = _mm512_set1_epi16(0x7FC0);
  for (int i = 0; i < n; i += 32) {
    __m512i w;
    __mmask32 lanes = 0xFFFFFFFFu;
    if (i + 32 <= n) {
      w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    } else {
      lanes = 0xFFFFu;
      w = _mm512_cvtepu8_epi16(
          _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    }
    const __m512i mag = _mm512_and_si512(w, mag_mask);
    const __m512i sign = _mm512_slli_epi16(_mm512_andnot_si512(mag_mask, w), 8);
    __m512i bits = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), bias);
    const __mmask32 subnormal = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
    bits = _mm512_mask_permutexvar_epi16(bits, subnormal, mag, table);
    bits = _mm512_mask_mov_epi16(bits, _mm512_cmpeq_epi16_mask(mag, mag_mask), nan);
    _mm512_mask_storeu_epi16(dst + i, lanes, _mm512_or_si512(bits, sign));
  }
}

}  // namespace kvattn::cpu
