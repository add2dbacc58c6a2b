#include "testing/fp8_accumulation.h"

#include <algorithm>
#include <cmath>

namespace kvattn::testing {

float fp8_mma_sum(float c, const float* a, const float* b, int k) {
  double terms[33];
  int n = 0;
  terms[n++] = double(c);
  double big = std::fabs(double(c)), exact = double(c);
  for (int i = 0; i < k && n < 33; ++i) {
    terms[n] = double(a[i]) * double(b[i]);  // exact: two 24-bit significands fit a double's 53
    exact += terms[n];
    big = std::max(big, std::fabs(terms[n]));
    ++n;
  }
  if (!std::isfinite(exact) || big == 0.0) return float(exact);
  const double quantum = std::ldexp(1.0, std::ilogb(big) - kFp8AccumulatorBits);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::trunc(terms[i] / quantum) * quantum;
  return float(sum);  // at most ~20 significant bits: exact in f32
}

}  // namespace kvattn::testing
