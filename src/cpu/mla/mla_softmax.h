// The online softmax of the MLA vector kernels whose lanes are heads (mla_avx2.cc,
// mla_avx512_bf16.cc), on their ISA's Simd (common/simd_avx2.h, simd_avx512.h). Include only
// from files built with that ISA's flags.
#pragma once

namespace kvattn::cpu {
// Internal linkage, as the Simd headers: each ISA's file has its own copy.
namespace {

// One token's scores st [keys][heads] of `visible` keys, vertical (no horizontal reductions):
// scaled to base 2, then replaced by the probabilities, and zeros from `visible` up to
// `zero_to`; the running max m and sum l of every head move on, alpha gets each head's rescale
// of the output.
template <class Simd>
inline void softmax_columns(float* st, int heads, int visible, int zero_to, float score_scale_log2,
                            float* m, float* l, float* alpha) {
  constexpr int W = Simd::kWidth;
  const auto scale = Simd::set1(score_scale_log2);
  for (int v = 0; v < heads; v += W) {
    const auto m_old = Simd::load(m + v);
    auto mx = m_old;
    for (int jj = 0; jj < visible; ++jj) {
      const auto x = Simd::mul(Simd::load(st + jj * heads + v), scale);
      Simd::store(st + jj * heads + v, x);
      mx = Simd::max(mx, x);
    }
    const auto a = Simd::exp2(Simd::sub(m_old, mx));
    auto sum = Simd::zero();
    for (int jj = 0; jj < visible; ++jj) {
      const auto prob = Simd::exp2(Simd::sub(Simd::load(st + jj * heads + v), mx));
      sum = Simd::add(sum, prob);
      Simd::store(st + jj * heads + v, prob);
    }
    for (int jj = visible; jj < zero_to; ++jj) Simd::store(st + jj * heads + v, Simd::zero());
    Simd::store(l + v, Simd::fma(Simd::load(l + v), a, sum));
    Simd::store(m + v, mx);
    Simd::store(alpha + v, a);
  }
}

}  // namespace
}  // namespace kvattn::cpu
