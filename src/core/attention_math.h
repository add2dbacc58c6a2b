// The attention math every backend shares, host and device (STYLE.md "Shared math lives in one
// header"): the online-softmax state and its merge, mask predicates, soft cap, ALiBi, RoPE
// angles. Small value types and functions; tested once on the CPU (tests/cuda/).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "core/math_constants.h"

namespace kvattn::math {

KVATTN_HD float neg_inf() { return -INFINITY; }
KVATTN_HD bool is_neg_inf(float x) { return x == -INFINITY; }

// ---- Online softmax -------------------------------------------------------------------------
// The running state of a softmax over a growing set of scores: m = max so far, d = sum of
// exp(s - m). The empty state is (-inf, 0); every operation keeps it an identity, never NaN.
struct SoftmaxState {
  float m = -INFINITY;
  float d = 0.0f;

  // exp(s - m) for the current max, 0 for s = -inf (also when m is still -inf).
  KVATTN_HD float weight(float s) const { return is_neg_inf(s) ? 0.0f : expf(s - m); }
  // Raises the max to `new_max` (>= m); returns the factor by which earlier weights (and the
  // output accumulated with them) must be multiplied.
  KVATTN_HD float raise_max(float new_max) {
    if (!(new_max > m)) return 1.0f;
    float factor = is_neg_inf(m) ? 0.0f : expf(m - new_max);
    d *= factor;
    m = new_max;
    return factor;
  }
  // Adds one score; returns its weight relative to the new max. `rescale` receives the factor
  // for earlier output.
  KVATTN_HD float add(float s, float* rescale) {
    *rescale = raise_max(s);
    float w = weight(s);
    d += w;
    return w;
  }
  // Natural-log log-sum-exp of the scores seen; -inf when there were none (or all were -inf);
  // NaN once a NaN score (or state) was added: NaN propagates, it never reads as empty.
  KVATTN_HD float lse() const { return d > 0.0f ? m + logf(d) : d == 0.0f ? -INFINITY : d; }
  // 1/d for normalizing the output; 0 for the empty state so that o becomes 0; NaN after a NaN.
  KVATTN_HD float inv_sum() const { return d > 0.0f ? 1.0f / d : d == 0.0f ? 0.0f : d; }
};

// Merging two normalized attention states (o_a, lse_a) and (o_b, lse_b) into the state over the
// union of their keys: o = w_a o_a + w_b o_b. A -inf side gets weight 0; both -inf give
// (0, 0, -inf).
struct MergeWeights {
  float w_a = 0.0f;
  float w_b = 0.0f;
  float lse = -INFINITY;
};
KVATTN_HD MergeWeights merge_weights(float lse_a, float lse_b) {
  MergeWeights r;
  if (is_neg_inf(lse_a) && is_neg_inf(lse_b)) return r;
  float m = lse_a > lse_b ? lse_a : lse_b;
  float e_a = is_neg_inf(lse_a) ? 0.0f : expf(lse_a - m);
  float e_b = is_neg_inf(lse_b) ? 0.0f : expf(lse_b - m);
  float sum = e_a + e_b;
  r.w_a = e_a / sum;
  r.w_b = e_b / sum;
  r.lse = m + logf(sum);
  return r;
}

// Merging many states one at a time: fold each (lse_i, o_i) in with `add`, which returns the
// factors for the accumulated output and for o_i; `lse()` at the end. Equivalent to a chain of
// merge_weights, but with one division at the end.
struct StateMerger {
  SoftmaxState acc;
  // o_acc = o_acc * (*scale_acc) + o_i * (*scale_i); divide by `sum()` at the end.
  KVATTN_HD void add(float lse_i, float* scale_acc, float* scale_i) {
    *scale_acc = acc.raise_max(lse_i);
    *scale_i = acc.weight(lse_i);
    acc.d += *scale_i;
  }
  KVATTN_HD float inv_sum() const { return acc.inv_sum(); }
  KVATTN_HD float lse() const { return acc.lse(); }
};

// ---- The end of a row ------------------------------------------------------------------------
// Every backend's epilogue (fa2, fa3, cpu): from a row's running max m (log2 units) and its sum of
// exponentials, the factor for the outputs (v_scale folded in) and the natural-log LSE. The
// numerics policy (docs/cuda.md): a row with no visible key gives o = 0 and lse = -inf; a NaN
// score of a visible key made the sum NaN, and the row gives o = NaN and lse = NaN, never an empty
// row that a split-KV merge would then drop.
struct RowFinish {
  float o_scale;
  float lse;
};
KVATTN_HD RowFinish finish_row(float m, float sum, float v_scale) {
  if (sum != sum) return RowFinish{sum, sum};
  if (!(sum > 0.0f)) return RowFinish{0.0f, -INFINITY};
  return RowFinish{v_scale / sum, (m + log2f(sum)) * kLn2};
}
// With an attention sink (natural-log logit) joining the denominator (DESIGN.md §2):
// m' = max(m, sink2), sum' = sum 2^(m - m') + 2^(sink2 - m'); a row with no visible key gives
// o = 0 and lse = sink. Only a row's final state takes the sink: a split chunk's partial
// excludes it and the merge adds it once.
KVATTN_HD RowFinish finish_row_with_sink(float m, float sum, float v_scale, float sink) {
  if (sum != sum) return RowFinish{sum, sum};
  if (!(sum > 0.0f)) return RowFinish{0.0f, sink};
  const float sink2 = sink * kLog2e;
  const float m_new = fmaxf(m, sink2);
  const float keys = exp2f(m - m_new);
  const float total = sum * keys + exp2f(sink2 - m_new);
  return RowFinish{v_scale * keys / total, (m_new + log2f(total)) * kLn2};
}

// ---- Score transforms, in the order DESIGN.md §2 applies them --------------------------------
// Soft cap c > 0: c * tanh(s / c); c <= 0: no cap.
KVATTN_HD float soft_cap(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }

// The standard ALiBi slope of head h among num_heads heads: with n = 2^floor(log2 H),
// 2^(-8(h+1)/n) for h < n, else 2^(-4(2(h-n)+1)/n).
KVATTN_HD float alibi_slope(int head, int num_heads) {
  int n = 1;
  while (n * 2 <= num_heads) n *= 2;
  if (head < n) return exp2f(-8.0f * float(head + 1) / float(n));
  return exp2f(-4.0f * float(2 * (head - n) + 1) / float(n));
}
// slope * (j - i_abs), where i_abs = i + kv_len - qo_len is the query's absolute position.
KVATTN_HD float alibi_bias(float slope, int64_t q_abs_pos, int64_t kv_pos) {
  return slope * float(kv_pos - q_abs_pos);
}

// ---- RoPE (llama) ---------------------------------------------------------------------------
// The element indices of rotation pair t in [0, D/2): (t, t + D/2), or (2t, 2t+1) interleaved.
struct RopePair {
  int first;
  int second;
};
KVATTN_HD RopePair rope_pair(int t, int head_dim, bool interleave) {
  return interleave ? RopePair{2 * t, 2 * t + 1} : RopePair{t, t + head_dim / 2};
}
// The pair t that element `e` belongs to, and whether it is the pair's first element.
KVATTN_HD int rope_pair_of(int e, int head_dim, bool interleave) {
  return interleave ? e / 2 : (e < head_dim / 2 ? e : e - head_dim / 2);
}
// angle = (pos / rope_scale) * rope_theta^(-2t/D).
KVATTN_HD float rope_angle(int64_t pos, int t, int head_dim, float rope_theta, float rope_scale) {
  float inv_freq = powf(rope_theta, -2.0f * float(t) / float(head_dim));
  return (float(pos) / rope_scale) * inv_freq;
}
// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
struct Rotated {
  float first;
  float second;
};
KVATTN_HD Rotated rope_rotate(float x1, float x2, float angle) {
  float s = sinf(angle), c = cosf(angle);
  return Rotated{x1 * c - x2 * s, x2 * c + x1 * s};
}

// ---- Masks ----------------------------------------------------------------------------------
// Query i (0-based within its request of qo_len queries) sits at absolute position
// i + kv_len - qo_len: the causal mask is bottom-right aligned.
KVATTN_HD int64_t query_abs_pos(int64_t i, int64_t qo_len, int64_t kv_len) {
  return i + kv_len - qo_len;
}
KVATTN_HD bool causal_visible(int64_t q_abs_pos, int64_t j) { return j <= q_abs_pos; }
// window_left < 0: no window.
KVATTN_HD bool window_visible(int64_t q_abs_pos, int64_t j, int window_left) {
  return window_left < 0 || j >= q_abs_pos - window_left;
}
// The keys [begin, end) that the causal / window masks leave to query at q_abs_pos out of
// kv_len; empty (begin >= end) when none. Lets a kernel skip fully masked tiles.
struct KeyRange {
  int64_t begin;
  int64_t end;
};
KVATTN_HD KeyRange visible_keys(int64_t q_abs_pos, int64_t kv_len, bool causal, int window_left) {
  int64_t end = kv_len;
  if (causal && q_abs_pos + 1 < end) end = q_abs_pos + 1;
  int64_t begin = 0;
  if (window_left >= 0 && q_abs_pos - window_left > begin) begin = q_abs_pos - window_left;
  if (end < 0) end = 0;
  return KeyRange{begin, end};
}

// A custom mask: per request a qo_len x kv_len boolean matrix, row-major, requests concatenated.
// Unpacked: one byte per bit. Packed: little-endian bits, each request starting at a byte
// boundary. `request_offset` is where the request starts: in bytes (unpacked: = bits).
KVATTN_HD bool custom_mask_bit(const uint8_t* mask, int64_t request_offset, bool packed, int64_t i,
                               int64_t j, int64_t kv_len) {
  int64_t bit = i * kv_len + j;
  if (!packed) return mask[request_offset + bit] != 0;
  return ((mask[request_offset + (bit >> 3)] >> (bit & 7)) & 1) != 0;
}
// Bytes the mask of one request takes.
KVATTN_HD int64_t custom_mask_bytes(int64_t qo_len, int64_t kv_len, bool packed) {
  int64_t bits = qo_len * kv_len;
  return packed ? (bits + 7) / 8 : bits;
}

}  // namespace kvattn::math
