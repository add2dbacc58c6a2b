#include "testing/baseline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/element_io.h"
#include "reference/kv_reader.h"
#include "testing/fp8_accumulation.h"

namespace kvattn::testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// llama RoPE in fp32, as a kernel computes it: frequency and angle in float.
void rope_rotate_f32(float* x, int dim, int64_t pos, const Problem& p) {
  const int half = dim / 2;
  for (int t = 0; t < half; ++t) {
    const float inv_freq = std::pow(p.rope_theta, -2.0f * static_cast<float>(t) / dim);
    const float angle = (static_cast<float>(pos) / p.rope_scale) * inv_freq;
    const float c = std::cos(angle), s = std::sin(angle);
    float& x1 = p.rope_interleave ? x[2 * t] : x[t];
    float& x2 = p.rope_interleave ? x[2 * t + 1] : x[t + half];
    const float r1 = x1 * c - x2 * s;
    const float r2 = x2 * c + x1 * s;
    x1 = r1;
    x2 = r2;
  }
}

// What the P.V MMA does to P before multiplying it with V: a 16-bit MMA takes P in q's type; an
// FP8 query's kernel (fa3: the FP8 PV wgmma, as FlashAttention-3) takes P as e4m3, for e4m3 and
// e5m2 queries alike (e4m3 is the finer of the two for P in [0, 1]). Unscaled: a kernel that
// scales P by 2^8 before rounding (FA3's guard against underflow) loses less, so this bounds it
// too.
float round_probability(float prob, DType q_dtype) {
  if (is_16bit_float(q_dtype)) return static_cast<float>(ref::round_to_dtype(prob, q_dtype));
  if (q_dtype == DType::kE4M3 || q_dtype == DType::kE5M2) {
    return static_cast<float>(ref::round_to_dtype(prob, DType::kE4M3));
  }
  return prob;
}

// An FP8 query's q . k as the FP8 tensor core sums it (fa3's S = Q K^T wgmma, 32 dims per
// instruction, the accumulator carried through them: testing/fp8_accumulation.h's reduced
// precision): a plain FP8 implementation on that hardware loses ~2^-13 of the largest product per
// step, which an LSE of one or a few keys shows; the bound must allow it.
float fp8_score(const float* q, const float* k, int dim) {
  float acc = 0.0f;
  for (int d0 = 0; d0 < dim; d0 += 32)
    acc = fp8_mma_sum(acc, q + d0, k + d0, std::min(32, dim - d0));
  return acc;
}

bool visible(const Problem& p, const ref::AttentionRows& rows, int b, int64_t i, int64_t j,
             int64_t i_abs) {
  if (p.mask_mode == MaskMode::kCausal && j > i_abs) return false;
  if (p.window_left >= 0 && j < i_abs - p.window_left) return false;
  if (p.mask_mode == MaskMode::kCustom && !rows.custom_mask_bit(b, i, j)) return false;
  return true;
}

}  // namespace

Status baseline_attention(const Problem& p, const AttentionArgs& args) {
  const ref::AttentionRows rows(p, args);
  const float sm_scale = p.effective_sm_scale();
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const bool rope = p.pos_encoding_mode == PosEncoding::kRopeLlama;
  std::vector<float> k, v, q(dqk), s, o(dvo);
  for (int b = 0; b < rows.batch_size(); ++b) {
    const int64_t qo_len = rows.qo_len(b), kv_len = rows.kv_len(b);
    if (qo_len == 0) continue;
    k.resize(kv_len * dqk);
    v.resize(kv_len * dvo);
    s.resize(kv_len);
    for (int kv_head = 0; kv_head < p.num_kv_heads; ++kv_head) {
      for (int64_t j = 0; j < kv_len; ++j) {
        float* k_row = k.data() + j * dqk;
        const auto k_scale = static_cast<float>(rows.k_scale(b, j, kv_head));
        const auto v_scale = static_cast<float>(rows.v_scale(b, j, kv_head));
        for (int d = 0; d < dqk; ++d)
          k_row[d] = static_cast<float>(rows.k(b, j, kv_head, d)) * k_scale;
        if (rope) rope_rotate_f32(k_row, dqk, j, p);
        for (int d = 0; d < dvo; ++d) {
          v[j * dvo + d] = static_cast<float>(rows.v(b, j, kv_head, d)) * v_scale;
        }
      }
      for (int g = 0; g < p.group_size(); ++g) {
        const int h = kv_head * p.group_size() + g;
        const float slope =
            p.pos_encoding_mode != PosEncoding::kAlibi
                ? 0.0f
                : static_cast<float>(args.alibi_slopes.empty() ? alibi_slope(h, p.num_qo_heads)
                                                               : ref::load(args.alibi_slopes, h));
        for (int64_t i = 0; i < qo_len; ++i) {
          const int64_t i_abs = i + kv_len - qo_len;
          for (int d = 0; d < dqk; ++d)
            q[d] = static_cast<float>(rows.q(b, i, h, d)) * rows.q_scale();
          if (rope) rope_rotate_f32(q.data(), dqk, i_abs, p);
          float max_score = kNegInf;
          for (int64_t j = 0; j < kv_len; ++j) {
            if (!visible(p, rows, b, i, j, i_abs)) {
              s[j] = kNegInf;
              continue;
            }
            float dot = 0.0f;
            if (is_fp8(p.q_dtype)) {
              dot = fp8_score(q.data(), k.data() + j * dqk, dqk);
            } else {
              for (int d = 0; d < dqk; ++d) dot += q[d] * k[j * dqk + d];
            }
            if (p.use_fp16_qk_reduction)
              dot = static_cast<float>(ref::round_to_dtype(dot, DType::kF16));
            float score = dot * sm_scale;
            if (p.logits_soft_cap > 0.0f) {
              score = p.logits_soft_cap * std::tanh(score / p.logits_soft_cap);
            }
            score += slope * static_cast<float>(j - i_abs);
            s[j] = score;
            max_score = std::max(max_score, score);
          }
          std::fill(o.begin(), o.end(), 0.0f);
          float lse = kNegInf;
          const float sink = rows.has_sinks() ? static_cast<float>(rows.sink(h)) : kNegInf;
          if (rows.has_sinks() && max_score == kNegInf) {
            lse = sink;
          } else if (max_score != kNegInf) {
            max_score = std::max(max_score, sink);
            float sum = rows.has_sinks() ? std::exp(sink - max_score) : 0.0f;
            for (int64_t j = 0; j < kv_len; ++j) {
              if (s[j] == kNegInf) continue;
              const float prob = std::exp(s[j] - max_score);
              sum += prob;
              const float prob_mma = round_probability(prob, p.q_dtype);
              for (int d = 0; d < dvo; ++d) o[d] += prob_mma * v[j * dvo + d];
            }
            for (int d = 0; d < dvo; ++d) o[d] /= sum;
            lse = max_score + std::log(sum);
          }
          for (int d = 0; d < dvo; ++d) rows.store_out(b, i, h, d, o[d]);
          if (rows.returns_lse()) rows.store_lse(b, i, h, lse);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvattn::testing
