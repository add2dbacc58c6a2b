// The arithmetic the DRAM probes (paged_interleave.cc, tile_prefetch.cc) put behind each line
// they load: W FMAs on 16 accumulators that stay in registers. Header-only, AVX-512.
#pragma once

#include <immintrin.h>

namespace probe {

// The 16 accumulators zeroed (unrolled, as fold: GCC keeps the array in registers only when
// every index is a constant; with a loop here or in fold it stored all 16 to the stack per line).
[[gnu::always_inline]] inline void zero(__m512* acc) {
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
}

// One line: added into accumulator 8P, then W FMAs into the other 7 of its half (P alternates by
// line, so no accumulator sees two operations a line).
template <int W, int P>
[[gnu::always_inline]] inline void consume(__m512 x, __m512* a) {
  a[8 * P] = _mm512_add_ps(a[8 * P], x);
#pragma GCC unroll 32
  for (int w = 0; w < W; ++w)
    a[8 * P + (w + 1) % 8] = _mm512_fmadd_ps(x, x, a[8 * P + (w + 1) % 8]);
}

// The 16 accumulators summed: a walk's result, so that its loads and FMAs are not dropped.
[[gnu::always_inline]] inline float fold(const __m512* acc) {
  __m512 sum = acc[0];
#pragma GCC unroll 16
  for (int k = 1; k < 16; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}

}  // namespace probe
