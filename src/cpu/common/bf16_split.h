// A float as the sum of two bf16, hi + lo, for vdpbf16ps products that must carry a factor one
// bf16 would round: the per-(token, head) FP8 V scales folded into the attention weights (the
// decode's DotTiles::pv_heads, the prefill's softmax_pack<true>). Include only from files
// compiled with the AVX-512 and AVX512_BF16 flags, outside any namespace.
#pragma once

#include <immintrin.h>

namespace kvattn::cpu {
// Internal linkage, as simd_avx512.h: each including file has its own ISA flags.
namespace {

// 16 weights w as bf16 words: hi = bf16(w), lo = bf16(w - hi) (w - hi exact in f32), both
// rounded to nearest even, so hi + lo is w to 2^-16 of it at worst: the tolerance's atol for f32
// outputs, which a single key (weight exactly 1, where the baseline does not err) is held to. lo
// is 0 where hi is inf or NaN (w - hi would be NaN; hi carries those alone). lo may have the
// other sign than hi, or be 0: a V of inf must not meet it (lo x inf would make w's infinity
// NaN), so the products of lo take V with its infinities zeroed (without_infinities).
inline void split_bf16(__m512 w, __m256i* hi, __m256i* lo) {
  *hi = (__m256i)_mm512_cvtneps_pbh(w);
  const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(*hi), 16));
  *lo = (__m256i)_mm512_cvtneps_pbh(
      _mm512_maskz_sub_ps(~_mm512_fpclass_ps_mask(back, 0x99), w, back));  // 0x99: NaN, +-inf
}

// 32 bf16 words with +-inf made 0 (NaN kept: lo x NaN is NaN as hi x NaN is).
inline __m512i without_infinities(__m512i words) {
  const __mmask32 inf = _mm512_cmpeq_epi16_mask(_mm512_and_si512(words, _mm512_set1_epi16(0x7FFF)),
                                                _mm512_set1_epi16(0x7F80));
  return _mm512_mask_mov_epi16(words, inf, _mm512_setzero_si512());
}

}  // namespace
}  // namespace kvattn::cpu
