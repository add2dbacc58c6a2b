// The reference attention: DESIGN.md §2 written out literally in fp64, one query row at a time.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "reference/element_io.h"
#include "reference/kv_reader.h"
#include "reference/reference.h"

namespace kvattn::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The keys and values of one (request, KV head), dequantized (real = stored * scale) and, for
// fused RoPE, with K rotated at its position j. Built once and shared by the query heads of the
// group.
struct HeadKV {
  int64_t len = 0;
  int dim_qk = 0, dim_vo = 0;
  std::vector<double> k, v;  // [len, dim_qk], [len, dim_vo]
  const double* k_row(int64_t j) const { return k.data() + j * dim_qk; }
  const double* v_row(int64_t j) const { return v.data() + j * dim_vo; }
};

HeadKV load_head_kv(const Problem& p, const AttentionRows& rows, int b, int kv_head) {
  HeadKV kv;
  kv.len = rows.kv_len(b);
  kv.dim_qk = p.head_dim_qk;
  kv.dim_vo = p.head_dim_vo;
  kv.k.resize(kv.len * kv.dim_qk);
  kv.v.resize(kv.len * kv.dim_vo);
  for (int64_t j = 0; j < kv.len; ++j) {
    double* k_row = kv.k.data() + j * kv.dim_qk;
    const double k_scale = rows.k_scale(b, j, kv_head), v_scale = rows.v_scale(b, j, kv_head);
    for (int d = 0; d < kv.dim_qk; ++d) k_row[d] = rows.k(b, j, kv_head, d) * k_scale;
    // RoPE rotates the dequantized key: the rotation is of the real vector.
    if (p.pos_encoding_mode == PosEncoding::kRopeLlama) {
      rope_rotate(k_row, kv.dim_qk, static_cast<double>(j), p.rope_theta, p.rope_scale,
                  p.rope_interleave);
    }
    double* v_row = kv.v.data() + j * kv.dim_vo;
    for (int d = 0; d < kv.dim_vo; ++d) v_row[d] = rows.v(b, j, kv_head, d) * v_scale;
  }
  return kv;
}

// Which keys query row i of request b sees: bottom-right causal, sliding window, custom mask.
class Visibility {
 public:
  Visibility(const Problem& p, const AttentionRows& rows, int b)
      : p_(p), rows_(rows), b_(b), offset_(rows.kv_len(b) - rows.qo_len(b)) {}

  bool sees(int64_t i, int64_t j) const {
    const int64_t i_abs = i + offset_;
    if (p_.mask_mode == MaskMode::kCausal && j > i_abs) return false;
    if (p_.window_left >= 0 && j < i_abs - p_.window_left) return false;
    if (p_.mask_mode == MaskMode::kCustom && !rows_.custom_mask_bit(b_, i, j)) return false;
    return true;
  }

 private:
  const Problem& p_;
  const AttentionRows& rows_;
  int b_;
  int64_t offset_;
};

double sm_scale_of(const Problem& p) {
  return p.sm_scale ? static_cast<double>(*p.sm_scale)
                    : 1.0 / std::sqrt(static_cast<double>(p.head_dim_qk));
}

std::vector<double> alibi_slopes_of(const Problem& p, const AttentionArgs& args) {
  std::vector<double> slopes(p.num_qo_heads, 0.0);
  if (p.pos_encoding_mode != PosEncoding::kAlibi) return slopes;
  for (int h = 0; h < p.num_qo_heads; ++h) {
    slopes[h] =
        args.alibi_slopes.empty() ? alibi_slope(h, p.num_qo_heads) : load(args.alibi_slopes, h);
  }
  return slopes;
}

// The score of query q (real, rotated) against key row j of `kv`.
double score(const Problem& p, double sm_scale, double alibi_slope, const double* q,
             const HeadKV& kv, int64_t j, int64_t i_abs) {
  const double* k = kv.k_row(j);
  double dot = 0.0;
  for (int d = 0; d < kv.dim_qk; ++d) dot += q[d] * k[d];
  // use_fp16_qk_reduction: the kernels that offer it accumulate q·k in f16 MMAs; its meaning here
  // is that the raw dot product (before sm_scale) is rounded to f16, once.
  if (p.use_fp16_qk_reduction) dot = round_to_dtype(dot, DType::kF16);
  double s = dot * sm_scale;
  if (p.logits_soft_cap > 0.0f) {
    const double cap = p.logits_soft_cap;
    s = cap * std::tanh(s / cap);
  }
  if (p.pos_encoding_mode == PosEncoding::kAlibi) {
    s += alibi_slope * static_cast<double>(j - i_abs);
  }
  return s;
}

void attend_head(const Problem& p, const AttentionRows& rows, int b, int qo_head, const HeadKV& kv,
                 double sm_scale, double alibi_slope) {
  const Visibility visibility(p, rows, b);
  const int64_t qo_len = rows.qo_len(b);
  const int64_t offset = kv.len - qo_len;
  std::vector<double> q(p.head_dim_qk), s(kv.len), o(p.head_dim_vo);
  std::vector<char> seen(kv.len);
  for (int64_t i = 0; i < qo_len; ++i) {
    const int64_t i_abs = i + offset;
    for (int d = 0; d < p.head_dim_qk; ++d) q[d] = rows.q(b, i, qo_head, d) * rows.q_scale();
    if (p.pos_encoding_mode == PosEncoding::kRopeLlama) {
      rope_rotate(q.data(), p.head_dim_qk, static_cast<double>(i_abs), p.rope_theta, p.rope_scale,
                  p.rope_interleave);
    }
    double max_score = kNegInf;
    bool nan_score = false;
    for (int64_t j = 0; j < kv.len; ++j) {
      seen[j] = visibility.sees(i, j);
      if (!seen[j]) continue;
      s[j] = score(p, sm_scale, alibi_slope, q.data(), kv, j, i_abs);
      nan_score |= std::isnan(s[j]);
      if (s[j] > max_score) max_score = s[j];
    }
    std::fill(o.begin(), o.end(), 0.0);
    double lse = kNegInf;
    // The sink joins the denominator only: m = max(sink, max_j s), sum gains e^(sink - m).
    const double sink = rows.has_sinks() ? rows.sink(qo_head) : kNegInf;
    if (nan_score) {
      // Numerics policy (docs/cuda.md): a NaN score of a visible key makes the row NaN, o and
      // lse alike, even when every visible score is NaN (never an "empty" row).
      std::fill(o.begin(), o.end(), std::numeric_limits<double>::quiet_NaN());
      lse = std::numeric_limits<double>::quiet_NaN();
    } else if (rows.has_sinks() && max_score == kNegInf) {
      lse = sink;
    } else if (max_score != kNegInf) {
      max_score = std::max(max_score, sink);
      double sum = rows.has_sinks() ? std::exp(sink - max_score) : 0.0;
      for (int64_t j = 0; j < kv.len; ++j) {
        if (!seen[j]) continue;
        const double w = std::exp(s[j] - max_score);
        sum += w;
        const double* v = kv.v_row(j);
        for (int d = 0; d < p.head_dim_vo; ++d) o[d] += w * v[d];
      }
      for (int d = 0; d < p.head_dim_vo; ++d) o[d] /= sum;
      lse = max_score + std::log(sum);
    }
    for (int d = 0; d < p.head_dim_vo; ++d) rows.store_out(b, i, qo_head, d, o[d]);
    if (rows.returns_lse()) rows.store_lse(b, i, qo_head, lse);
  }
}

}  // namespace

void rope_rotate(double* x, int dim, double pos, double rope_theta, double rope_scale,
                 bool interleave) {
  const int half = dim / 2;
  for (int t = 0; t < half; ++t) {
    const double angle = (pos / rope_scale) * std::pow(rope_theta, -2.0 * t / dim);
    const double c = std::cos(angle), s = std::sin(angle);
    double& x1 = interleave ? x[2 * t] : x[t];
    double& x2 = interleave ? x[2 * t + 1] : x[t + half];
    const double r1 = x1 * c - x2 * s;
    const double r2 = x2 * c + x1 * s;
    x1 = r1;
    x2 = r2;
  }
}

Status attention(const Problem& p, const AttentionArgs& args) {
  const AttentionRows rows(p, args);
  const double sm_scale = sm_scale_of(p);
  const std::vector<double> slopes = alibi_slopes_of(p, args);
  const int group = p.group_size();
  struct Item {
    int request, kv_head;
  };
  std::vector<Item> items;
  for (int b = 0; b < rows.batch_size(); ++b) {
    if (rows.qo_len(b) == 0) continue;
    for (int kv_head = 0; kv_head < p.num_kv_heads; ++kv_head) items.push_back({b, kv_head});
  }
  auto attend_item = [&](const Item& item) {
    const HeadKV kv = load_head_kv(p, rows, item.request, item.kv_head);
    for (int g = 0; g < group; ++g) {
      const int qo_head = item.kv_head * group + g;
      attend_head(p, rows, item.request, qo_head, kv, sm_scale, slopes[qo_head]);
    }
  };
  // The (request, KV head) items read shared inputs and write disjoint output rows, and each is
  // computed the same way whichever thread takes it: running them on all cores changes nothing
  // in the result, and makes the reference usable on serving-sized problems.
  std::atomic<std::size_t> next_item{0};
  auto worker = [&] {
    for (std::size_t i = next_item++; i < items.size(); i = next_item++) attend_item(items[i]);
  };
  const std::size_t num_threads =
      std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), items.size());
  std::vector<std::jthread> helpers;
  for (std::size_t t = 1; t < num_threads; ++t) helpers.emplace_back(worker);
  worker();
  return Status::Ok();
}

}  // namespace kvattn::ref
