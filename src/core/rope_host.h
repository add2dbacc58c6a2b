// RoPE cos/sin per rotation pair in fp64, for the host backends: the reference and the cpu
// backend both take their angles from here, so their results agree bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "kvattn/attention.h"

namespace kvattn {

// The rotated dims [0, R) of a head of `head_dim` dims (validated: even, 2 <= R <= head_dim).
inline int rope_rotary_dim(const RopeParams& rope, int head_dim) {
  if (!rope.cos_sin_cache.empty()) return static_cast<int>(rope.cos_sin_cache.shape[1]);
  return rope.rotary_dim == 0 ? head_dim : rope.rotary_dim;
}

// Llama 3.1: a frequency whose wavelength 2*pi/f is shorter than old_context_len /
// high_freq_factor keeps f, one longer than old_context_len / low_freq_factor becomes
// f / rope_scale, and between the two it is blended linearly in old_context_len / wavelength.
// FlashInfer computes the blend weight as f * smooth_a + smooth_b, clamped to [0, 1]; this is
// the same expression solved for the wavelength.
inline double llama31_frequency(double f, const Llama31Scaling& l, double rope_scale) {
  const double wavelen = 2.0 * std::numbers::pi / f;
  const double low = l.low_freq_factor, high = l.high_freq_factor;
  const double smooth = std::clamp((l.old_context_len / wavelen - low) / (high - low), 0.0, 1.0);
  return (1.0 - smooth) * f / rope_scale + smooth * f;
}

// cos and sin of the angle of each pair t in [0, R/2) at position `pos` (which validation keeps
// inside the cache's rows when there is one).
inline void rope_cos_sin(int64_t pos, int rotary_dim, const RopeParams& rope, double* cos_t,
                         double* sin_t) {
  const int half = rotary_dim / 2;
  if (!rope.cos_sin_cache.empty()) {
    const TensorView& c = rope.cos_sin_cache;
    const float* row = static_cast<const float*>(c.data) + pos * c.strides[0];
    for (int t = 0; t < half; ++t) {
      cos_t[t] = row[t * c.strides[1]];
      sin_t[t] = row[(half + t) * c.strides[1]];
    }
    return;
  }
  for (int t = 0; t < half; ++t) {
    const double f = std::pow(static_cast<double>(rope.rope_theta), -2.0 * t / rotary_dim);
    // Without llama31 the position is scaled, in this order, as fused RoPE does.
    const double angle =
        rope.llama31
            ? static_cast<double>(pos) * llama31_frequency(f, *rope.llama31, rope.rope_scale)
            : (static_cast<double>(pos) / static_cast<double>(rope.rope_scale)) * f;
    cos_t[t] = std::cos(angle);
    sin_t[t] = std::sin(angle);
  }
}

// Rotates pairs t in [0, R/2) of x by (cos_t, sin_t): (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
// Dims [R, D) are left alone.
inline void rope_rotate_pairs(double* x, int rotary_dim, bool interleave, const double* cos_t,
                              const double* sin_t) {
  const int half = rotary_dim / 2;
  for (int t = 0; t < half; ++t) {
    const int i1 = interleave ? 2 * t : t;
    const int i2 = interleave ? 2 * t + 1 : t + half;
    const double a = x[i1], b = x[i2];
    x[i1] = a * cos_t[t] - b * sin_t[t];
    x[i2] = b * cos_t[t] + a * sin_t[t];
  }
}

}  // namespace kvattn
