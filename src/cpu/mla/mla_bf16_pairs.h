// What the MLA kernels on bf16 pairs share (mla_avx512_bf16.cc, mla_amx.cc): the tile rows as
// bf16, the value pairs of two rows and the probability pairs of two score vectors. Include only
// from files built with the AVX512_BF16 flags.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/common/simd_avx512.h"
#include "cpu/mla/mla_e4m3.h"
#include "kvattn/dtype.h"

namespace kvattn::cpu {
// Internal linkage, as simd_avx512.h: each ISA's file has its own copy.
namespace {

// A row of n values (n % 16 == 0) of a bf16 / fp8 cache as bf16 bits, widened exactly.
template <DType KV>
inline void row_to_bf16(const std::byte* src, int n, uint16_t* dst) {
  if constexpr (KV == DType::kBF16) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * 2);
  } else if constexpr (KV == DType::kE4M3) {
    e4m3_to_bf16(reinterpret_cast<const uint8_t*>(src), n, dst);
  } else {
    for (int i = 0; i < n; i += 16) {
      const __m512 x =
          avx512::Simd::load_raw<KV>(src + static_cast<std::size_t>(i) * dtype_size(KV));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(x));
    }
  }
}

// The V pairs of ckv rows a and c (c may be a zero row) at dst: unpacks of 16-bit words, so the
// 32 columns of each block come in the order (0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, ...);
// each kernel puts them back as it writes the output.
inline void pair_rows(const uint16_t* a, const uint16_t* c, int d_ckv, uint32_t* dst) {
  for (int blk = 0; blk < d_ckv / 32; ++blk) {
    const __m512i ra = _mm512_loadu_si512(a + blk * 32);
    const __m512i rc = _mm512_loadu_si512(c + blk * 32);
    _mm512_storeu_si512(dst + blk * 32, _mm512_unpacklo_epi16(ra, rc));
    _mm512_storeu_si512(dst + blk * 32 + 16, _mm512_unpackhi_epi16(ra, rc));
  }
}

// vcvtne2ps2bf16 rounds two vectors to bf16 side by side, [a | b]; vpermw by this index
// interleaves them into pair words (a[i], b[i]).
alignas(64) constexpr int16_t kPairInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                     21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                     11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
inline __m512i bf16_pairs(__m512 a, __m512 b, __m512i interleave) {
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

}  // namespace
}  // namespace kvattn::cpu
