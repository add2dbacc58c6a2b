// The reference versions of the operations that are not attention: merging attention states,
// appending to a paged cache, and RoPE by positions. fp64 math, results rounded once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "core/rope_host.h"
#include "core/status_macros.h"
#include "reference/element_io.h"
#include "reference/reference.h"

namespace kvattn::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Merges `count` attention states of one row: state k has log-sum-exp lse(k) and output vector
// element v(k, d). The merged state is the attention over the union of their key sets:
// o = Σ_k exp(lse_k - m) o_k / Σ_k exp(lse_k - m), lse = m + log Σ_k exp(lse_k - m), m = max lse.
// A state with lse = -inf saw no key: it is skipped (not multiplied by 0, so that whatever its
// o holds, even NaN, cannot leak). With no state left, o = 0 and lse = -inf.
template <class Lse, class Value, class WriteO>
double merge_row(int64_t count, int64_t dim, Lse lse, Value v, WriteO write_o) {
  double max_lse = kNegInf;
  for (int64_t k = 0; k < count; ++k) {
    const double s = lse(k);
    if (std::isnan(s)) {
      for (int64_t d = 0; d < dim; ++d) write_o(d, s);
      return s;
    }
    if (s > max_lse) max_lse = s;
  }
  if (max_lse == kNegInf) {
    for (int64_t d = 0; d < dim; ++d) write_o(d, 0.0);
    return kNegInf;
  }
  std::vector<double> weight(count, 0.0);
  double sum = 0.0;
  for (int64_t k = 0; k < count; ++k) {
    const double s = lse(k);
    if (s == kNegInf) continue;
    weight[k] = std::exp(s - max_lse);
    sum += weight[k];
  }
  for (int64_t d = 0; d < dim; ++d) {
    double o = 0.0;
    for (int64_t k = 0; k < count; ++k) {
      if (weight[k] != 0.0) o += weight[k] * v(k, d);
    }
    write_o(d, o / sum);
  }
  return max_lse + std::log(sum);
}

int64_t cache_page_size(const PagedKVCache& cache) {
  return cache.layout == KVLayout::kNHD ? cache.k_cache.shape[1] : cache.k_cache.shape[2];
}

void store_cache(const TensorView& t, KVLayout layout, int64_t page, int64_t slot, int64_t head,
                 int64_t d, double value) {
  if (layout == KVLayout::kNHD) {
    store(t, value, page, slot, head, d);
  } else {
    store(t, value, page, head, slot, d);
  }
}

}  // namespace

Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out) {
  const int64_t rows = v_a.shape[0], heads = v_a.shape[1], dim = v_a.shape[2];
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      const double lse = merge_row(
          2, dim, [&](int64_t k) { return k == 0 ? load(s_a, n, h) : load(s_b, n, h); },
          [&](int64_t k, int64_t d) { return k == 0 ? load(v_a, n, h, d) : load(v_b, n, h, d); },
          [&](int64_t d, double o) { store(v_out, o, n, h, d); });
      if (!s_out.empty()) store(s_out, lse, n, h);
    }
  }
  return Status::Ok();
}

Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                    const TensorView& s_out) {
  const int64_t rows = v.shape[0], states = v.shape[1], heads = v.shape[2], dim = v.shape[3];
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      const double lse = merge_row(
          states, dim, [&](int64_t k) { return load(s, n, k, h); },
          [&](int64_t k, int64_t d) { return load(v, n, k, h, d); },
          [&](int64_t d, double o) { store(v_out, o, n, h, d); });
      if (!s_out.empty()) store(s_out, lse, n, h);
    }
  }
  return Status::Ok();
}

Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& cache) {
  const int64_t nnz = append_k.shape[0];
  const int64_t batch = cache.kv_indptr.shape[0] - 1;
  const int64_t num_pages = cache.k_cache.shape[0];
  const int64_t page_size = cache_page_size(cache);
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t b = load_i32(batch_indices, i);
    if (b == kPaddedAppendRow) continue;  // a padded row writes nothing
    const int64_t pos = load_i32(positions, i);
    // Validation proves these; the reference re-checks because an out-of-range page here would
    // be a write outside the cache.
    if (b < 0 || b >= batch || pos < 0) {
      return make_error(ErrorCode::kInvalidArgument, "append_paged_kv_cache: entry ", i,
                        " has batch index ", b, " and position ", pos, " outside the batch");
    }
    const int64_t page_begin = load_i32(cache.kv_indptr, b);
    const int64_t page_end = load_i32(cache.kv_indptr, b + 1);
    if (page_begin + pos / page_size >= page_end) {
      return make_error(ErrorCode::kInvalidArgument, "append_paged_kv_cache: position ", pos,
                        " of request ", b, " is past its ", page_end - page_begin, " pages");
    }
    const int64_t page = load_i32(cache.kv_indices, page_begin + pos / page_size);
    if (page < 0 || page >= num_pages) {
      return make_error(ErrorCode::kInvalidPageTable, "append_paged_kv_cache: page id ", page,
                        " is outside [0, ", num_pages, ")");
    }
    const int64_t slot = pos % page_size;
    const bool per_token = cache.scale_granularity == KVScaleGranularity::kPerTokenHead;
    const bool e5m2 = cache.k_cache.dtype == DType::kE5M2;
    auto write = [&](const TensorView& src, const TensorView& dst, const TensorView& scales,
                     double per_tensor) {
      for (int64_t h = 0; h < src.shape[1]; ++h) {
        double scale = per_tensor;
        if (per_token) {
          double amax = 0.0;
          for (int64_t d = 0; d < src.shape[2]; ++d)
            amax = std::max(amax, std::abs(load(src, i, h, d)));
          const float stored = num::per_token_fp8_scale(amax, e5m2);
          store(scales, stored, page, slot, h);
          scale = stored;
        }
        for (int64_t d = 0; d < src.shape[2]; ++d) {
          store_cache(dst, cache.layout, page, slot, h, d, load(src, i, h, d) / scale);
        }
      }
    };
    write(append_k, cache.k_cache, cache.k_scale_cache, cache.k_scale);
    write(append_v, cache.v_cache, cache.v_scale_cache, cache.v_scale);
  }
  return Status::Ok();
}

Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                  const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope) {
  // Each head vector is read whole before it is written, so q_out may be q itself.
  auto rotate_all = [&](const TensorView& in, const TensorView& out) {
    if (in.empty() || out.empty()) return;
    const int64_t rows = in.shape[0], heads = in.shape[1];
    const int dim = static_cast<int>(in.shape[2]);
    const int rotary_dim = rope_rotary_dim(rope, dim);
    std::vector<double> x(dim), cos_t(rotary_dim / 2), sin_t(rotary_dim / 2);
    for (int64_t n = 0; n < rows; ++n) {
      rope_cos_sin(load_i32(pos_ids, n), rotary_dim, rope, cos_t.data(), sin_t.data());
      for (int64_t h = 0; h < heads; ++h) {
        // Dims past rotary_dim round-trip through fp64 unchanged: exact for every value dtype.
        for (int d = 0; d < dim; ++d) x[d] = load(in, n, h, d);
        rope_rotate_pairs(x.data(), rotary_dim, rope.interleave, cos_t.data(), sin_t.data());
        for (int d = 0; d < dim; ++d) store(out, x[d], n, h, d);
      }
    }
  };
  rotate_all(q, q_out);
  rotate_all(k, k_out);
  return Status::Ok();
}

}  // namespace kvattn::ref
