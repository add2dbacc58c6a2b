// Helpers of the numerics-under-stress tests: writing chosen values into a case's tensors
// through its views (any layout), and the exact softmax of a few logits in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvattn/attention.h"
#include "testing/case_builder.h"

namespace kvattn::hardening {

inline int32_t index_of(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

// Writes `value` (converted to the view's dtype) at element `offset` of `t`.
inline void store(const TensorView& t, int64_t offset, float value) {
  testing::from_f32(
      &value, 1, t.dtype,
      static_cast<std::byte*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype)));
}

// Element d of key (or value) token j of request b, KV head h, in the case's K/V tensors.
inline void set_kv(const Problem& p, const AttentionArgs& a, bool value_tensor, int64_t b,
                   int64_t j, int64_t h, int64_t d, float x) {
  const bool nhd = p.kv_layout == KVLayout::kNHD;
  if (is_paged(p.op)) {
    const TensorView& t = value_tensor ? a.paged_v_cache : a.paged_k_cache;
    const int64_t page = index_of(a.kv_indices, index_of(a.kv_indptr, b) + j / p.page_size);
    const int64_t slot = j % p.page_size;
    const int64_t offset = page * t.strides[0] + (nhd ? slot : h) * t.strides[1] +
                           (nhd ? h : slot) * t.strides[2] + d * t.strides[3];
    store(t, offset, x);
    return;
  }
  const TensorView& t = value_tensor ? a.v : a.k;
  if (p.op == Op::kBatchPrefillRagged) {
    const int64_t row = index_of(a.kv_indptr, b) + j;
    store(t, row * t.strides[0] + h * t.strides[1] + d * t.strides[2], x);
    return;
  }
  const int64_t offset =
      nhd ? j * t.strides[0] + h * t.strides[1] : h * t.strides[0] + j * t.strides[1];
  store(t, offset + d * t.strides[2], x);
}

// Element d of query row `row` (over the whole batch), head h.
inline void set_q(const Problem& p, const AttentionArgs& a, int64_t row, int64_t h, int64_t d,
                  float x) {
  const TensorView& t = a.q;
  if (p.op == Op::kSingleDecode) {
    store(t, h * t.strides[0] + d * t.strides[1], x);
  } else {
    store(t, row * t.strides[0] + h * t.strides[1] + d * t.strides[2], x);
  }
}

// softmax-weighted sum and natural-log LSE of `logits` over `values`, in double with the max
// subtracted: the exact answer the stressed backends must reproduce.
struct ExactSoftmax {
  std::vector<double> out;
  double lse;
};
inline ExactSoftmax exact_softmax(const std::vector<double>& logits,
                                  const std::vector<std::vector<double>>& values) {
  double m = -INFINITY;
  for (double s : logits) m = std::max(m, s);
  double sum = 0;
  for (double s : logits) sum += std::exp(s - m);
  ExactSoftmax r{std::vector<double>(values.empty() ? 0 : values[0].size(), 0.0),
                 m + std::log(sum)};
  for (std::size_t j = 0; j < logits.size(); ++j) {
    const double w = std::exp(logits[j] - m) / sum;
    for (std::size_t d = 0; d < r.out.size(); ++d) r.out[d] += w * values[j][d];
  }
  return r;
}

}  // namespace kvattn::hardening
