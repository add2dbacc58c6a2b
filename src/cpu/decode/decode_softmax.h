// The decode kernel's scores and online softmax (decode_kernel.h): raw dot products of a tile
// turned into base-2 logits (scale, soft cap, ALiBi, mask), and the online-softmax step of a
// block of query rows. Templates on the vector-helper struct S, as the kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/math_constants.h"
#include "cpu/decode/decode.h"
#include "cpu/decode/decode_fma_tiles.h"

namespace kvattn::cpu::decode_detail {

using math::kLog2e;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Raw scores of one tile -> base-2 logits (scaled, soft-capped, ALiBi, masked); lanes past n get
// -inf. `raw_to_real` is the K raw factor, `k_scale` the head's K scale and `key_scale` (may be
// null) each key's per-(token, head) K scale, padded to the vector width.
template <class S>
void transform_scores(const DecodeParams& p, float* s, int n, int64_t j0, int64_t q_pos,
                      float alibi_slope, const uint8_t* visible, float raw_to_real,
                      float k_scale_value, const float* key_scale) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  const Vec raw = S::set1(raw_to_real);
  if (!p.general_scores()) {
    const Vec scale = S::set1(k_scale_value * p.sm_scale * kLog2e);
    if (key_scale) {
      for (int kb = 0; kb < n; kb += W) {
        S::store(s + kb,
                 S::mul(S::mul(S::mul(S::load(s + kb), raw), scale), S::load(key_scale + kb)));
      }
    } else {
      for (int kb = 0; kb < n; kb += W) {
        S::store(s + kb, S::mul(S::mul(S::load(s + kb), raw), scale));
      }
    }
  } else {
    const Vec k_scale = S::set1(k_scale_value), sm_scale = S::set1(p.sm_scale);
    const float cap = p.logits_soft_cap;
    for (int kb = 0; kb < n; kb += W) {
      Vec x = S::mul(S::mul(S::load(s + kb), raw), k_scale);
      if (key_scale) x = S::mul(x, S::load(key_scale + kb));
      if (p.fp16_qk_reduction) x = S::round_f16(x);
      x = S::mul(x, sm_scale);
      if (cap > 0) x = S::mul(S::set1(cap), S::tanh(S::mul(x, S::set1(1.0f / cap))));
      if (p.alibi_slopes) {
        const Vec distance = S::iota(static_cast<float>(j0 + kb - q_pos));
        x = S::fma(S::set1(alibi_slope), distance, x);
      }
      if (visible) x = S::mask_by_bytes(x, visible + kb);
      S::store(s + kb, S::mul(x, S::set1(kLog2e)));
    }
  }
  for (int kk = n; kk < (n + W - 1) / W * W; ++kk) s[kk] = kNegInf;
}

// One online-softmax step for rows [0, rows) of a head: `logits(g, s)` turns row g's raw scores
// into base-2 logits in place (lanes past n -inf) and returns their vector max; then the rescale
// factors of 16 rows by one vector exp2, the probabilities (times `value_scale`, each key's
// per-token V scale, where given: the sum takes them unscaled), the running max and sum updated
// and the accumulated output rescaled. A row that saw no visible key gets zero weights; returns
// whether any row saw one.
template <class S, class Logits>
bool softmax_rows(float* scores, int rows, int n, const Logits& logits, const float* value_scale,
                  float* running_max, float* running_sum, float* o, int o_row) {
  using Vec = typename S::Vec;
  constexpr int W = S::kWidth;
  bool any = false;
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int count = std::min(16, rows - r0);
    alignas(64) float old_max[16] = {}, new_max[16] = {}, alpha[16];
    for (int i = 0; i < count; ++i) {
      old_max[i] = running_max[r0 + i];
      // The max skips NaN (a NaN score makes the sum NaN below).
      new_max[i] = std::max(old_max[i], S::reduce_max(logits(r0 + i, scores + (r0 + i) * kTile)));
    }
    for (int i = 0; i < 16; i += W) {
      S::store(alpha + i, S::exp2(S::sub(S::load(old_max + i), S::load(new_max + i))));
    }
    for (int i = 0; i < count; ++i) {
      const int g = r0 + i;
      float* s = scores + g * kTile;
      if (new_max[i] == kNegInf) {
        // Every score so far is -inf or NaN: a NaN still makes the row NaN.
        for (int k = 0; k < n; ++k) {
          if (std::isnan(s[k])) running_sum[g] = std::numeric_limits<float>::quiet_NaN();
        }
        std::fill(s, s + kTile, 0.0f);
        continue;
      }
      const Vec m = S::set1(new_max[i]);
      Vec sum = S::zero();
      for (int kb = 0; kb < n; kb += W) {
        const Vec e = S::exp2(S::sub(S::load(s + kb), m));
        sum = S::add(sum, e);
        S::store(s + kb, value_scale ? S::mul(e, S::load(value_scale + kb)) : e);
      }
      running_sum[g] = running_sum[g] * alpha[i] + S::reduce_add(sum);
      running_max[g] = new_max[i];
      if (alpha[i] != 1.0f) {
        const Vec a = S::set1(alpha[i]);
        float* og = o + g * o_row;
        for (int d = 0; d < o_row; d += W) S::store(og + d, S::mul(S::load(og + d), a));
      }
      any = true;
    }
  }
  return any;
}

}  // namespace kvattn::cpu::decode_detail
