// validate_variants.h: sinks and per-head / per-(token, head) K/V scales.
#include "core/validate_variants.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/status_macros.h"
#include "core/validate_tensor.h"

namespace kvattn::validation {
namespace {

struct Named {
  const TensorView* view;
  const char* name;
};

Status check_present(const TensorView& t, const char* name, bool wanted, const char* why) {
  if (wanted) {
    if (t.empty()) {
      return make_error(ErrorCode::kInvalidArgument, name, ": not given, but ", why);
    }
    return check_view(t, name);
  }
  if (!t.empty()) {
    return make_error(ErrorCode::kInvalidArgument, name, ": given, but not ", why,
                      " (never a silently ignored input)");
  }
  return Status::Ok();
}

float at1(const TensorView& t, int64_t i) { return t.as<const float>()[i * t.strides[0]]; }

Status check_finite_positive(const TensorView& t, const char* name) {
  for (int64_t i = 0; i < t.shape[0]; ++i) {
    const float x = at1(t, i);
    if (!std::isfinite(x) || x <= 0.0f) {
      return make_error(ErrorCode::kInvalidScale, name, "[", i, "] = ", x,
                        ": must be finite and positive");
    }
  }
  return Status::Ok();
}

// Rows [row0, row0 + n) of a [rows..., H_kv] scale cache viewed as (row, head) with strides.
Status check_scale_rows(const TensorView& t, const char* name, const int64_t* prefix,
                        int prefix_rank, int64_t first_row, int64_t n, int64_t heads) {
  const float* base = t.as<const float>();
  int64_t offset = 0;
  for (int d = 0; d < prefix_rank; ++d) offset += prefix[d] * t.strides[d];
  const int64_t row_stride = t.strides[prefix_rank];
  const int64_t head_stride = t.strides[prefix_rank + 1];
  for (int64_t r = first_row; r < first_row + n; ++r) {
    const float* row = base + offset + r * row_stride;
    bool bad = false;
    for (int64_t h = 0; h < heads; ++h) {
      const float x = row[h * head_stride];
      bad |= !(x > 0.0f) || !(x <= 3.402823466e38f);
    }
    if (!bad) continue;
    for (int64_t h = 0; h < heads; ++h) {
      const float x = row[h * head_stride];
      if (std::isfinite(x) && x > 0.0f) continue;
      std::string where;
      for (int d = 0; d < prefix_rank; ++d) where += std::to_string(prefix[d]) + ", ";
      return make_error(ErrorCode::kInvalidScale, name, "[", where, r, ", ", h, "] = ", x,
                        ": must be finite and positive");
    }
  }
  return Status::Ok();
}

// Every slot the requests read, per request.
Status check_scale_cache_values(const Problem& p, const AttentionArgs& a, const TensorView& t,
                                const char* name) {
  const int64_t heads = p.num_kv_heads;
  switch (p.op) {
    case Op::kSingleDecode:
    case Op::kSinglePrefill:
      return check_scale_rows(t, name, nullptr, 0, 0, t.shape[0], heads);
    case Op::kBatchPrefillRagged:
      return check_scale_rows(t, name, nullptr, 0, 0, t.shape[0], heads);
    case Op::kBatchDecode:
    case Op::kBatchPrefillPaged:
      for (int64_t b = 0; b < p.batch_size; ++b) {
        const int64_t kv_len = paged_kv_len(a.kv_indptr, a.kv_last_page_len, b, p.page_size);
        const int64_t first = index_at(a.kv_indptr, b);
        for (int64_t j = 0; j < kv_len; j += p.page_size) {
          const int64_t page = index_at(a.kv_indices, first + j / p.page_size);
          const int64_t n = std::min<int64_t>(p.page_size, kv_len - j);
          KVATTN_RETURN_IF_ERROR(check_scale_rows(t, name, &page, 1, 0, n, heads));
        }
      }
      return Status::Ok();
    case Op::kBatchMLAPaged:  // MLA takes per-tensor scales only (validate_mla_problem)
      return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace

Status check_sinks_and_scales(const Problem& p, const AttentionArgs& a, int64_t kv_rows) {
  const bool per_head = p.kv_scale_granularity == KVScaleGranularity::kPerHead;
  const bool per_token = p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead;
  KVATTN_RETURN_IF_ERROR(check_present(a.sinks, "sinks", p.use_sinks, "use_sinks is true"));
  KVATTN_RETURN_IF_ERROR(
      check_present(a.k_scale, "k_scale", per_head, "kv_scale_granularity is per_head"));
  KVATTN_RETURN_IF_ERROR(
      check_present(a.v_scale, "v_scale", per_head, "kv_scale_granularity is per_head"));
  KVATTN_RETURN_IF_ERROR(check_present(a.k_scale_cache, "k_scale_cache", per_token,
                                       "kv_scale_granularity is per_token_head"));
  KVATTN_RETURN_IF_ERROR(check_present(a.v_scale_cache, "v_scale_cache", per_token,
                                       "kv_scale_granularity is per_token_head"));
  const Named views[] = {{&a.sinks, "sinks"},
                         {&a.k_scale, "k_scale"},
                         {&a.v_scale, "v_scale"},
                         {&a.k_scale_cache, "k_scale_cache"},
                         {&a.v_scale_cache, "v_scale_cache"}};
  for (const Named& n : views) {
    if (n.view->empty()) continue;
    KVATTN_RETURN_IF_ERROR(check_dtype(*n.view, n.name, DType::kF32));
    KVATTN_RETURN_IF_ERROR(check_same_memory(*n.view, n.name, a.q, "q"));
    KVATTN_RETURN_IF_ERROR(check_no_overlap(a.out, "out", *n.view, n.name));
    KVATTN_RETURN_IF_ERROR(check_no_overlap(a.lse, "lse", *n.view, n.name));
  }
  // Values in device memory are not readable here; host ones are checked.
  const bool host = a.q.memory == MemoryKind::kHost;
  if (p.use_sinks) {
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.sinks, "sinks", "[H_qo]", {{p.num_qo_heads, "num_qo_heads"}}));
    for (int64_t h = 0; host && h < a.sinks.shape[0]; ++h) {
      if (!std::isfinite(at1(a.sinks, h))) {
        return make_error(ErrorCode::kInvalidArgument, "sinks[", h, "] = ", at1(a.sinks, h),
                          ": must be finite");
      }
    }
  }
  if (per_head) {
    for (const Named& n : {Named{&a.k_scale, "k_scale"}, Named{&a.v_scale, "v_scale"}}) {
      KVATTN_RETURN_IF_ERROR(
          check_shape(*n.view, n.name, "[H_kv]", {{p.num_kv_heads, "num_kv_heads"}}));
      if (host) KVATTN_RETURN_IF_ERROR(check_finite_positive(*n.view, n.name));
    }
  }
  if (per_token) {
    for (const Named& n :
         {Named{&a.k_scale_cache, "k_scale_cache"}, Named{&a.v_scale_cache, "v_scale_cache"}}) {
      const int64_t h_kv = p.num_kv_heads;
      if (is_paged(p.op)) {
        KVATTN_RETURN_IF_ERROR(check_shape(*n.view, n.name, "[num_pages, page_size, H_kv]",
                                           {{a.paged_k_cache.shape[0], "num_pages of the cache"},
                                            {p.page_size, "page_size"},
                                            {h_kv, "num_kv_heads"}}));
      } else if (p.op == Op::kBatchPrefillRagged) {
        KVATTN_RETURN_IF_ERROR(check_shape(*n.view, n.name, "[kv_indptr[B], H_kv]",
                                           {{kv_rows, "kv_indptr[B]"}, {h_kv, "num_kv_heads"}}));
      } else {
        const int64_t kv_len = a.k.shape[p.kv_layout == KVLayout::kNHD ? 0 : 1];
        KVATTN_RETURN_IF_ERROR(check_shape(*n.view, n.name, "[kv_len, H_kv]",
                                           {{kv_len, "k's kv_len"}, {h_kv, "num_kv_heads"}}));
      }
      if (host) KVATTN_RETURN_IF_ERROR(check_scale_cache_values(p, a, *n.view, n.name));
    }
  }
  return Status::Ok();
}

}  // namespace kvattn::validation
