// validate_variants.h: sinks and per-head / per-(token, head) K/V scales.
#include "core/validate_variants.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

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
  if (head_stride == 1 && row_stride == heads) {
    // The rows are one block (a page's, or the whole cache): one pass over its bits, which the
    // compiler vectorizes. Finite and positive is bits 1 .. 0x7F7FFFFF (the smallest denormal to
    // FLT_MAX); the per-row loop below runs only to name the bad value. Per (page, row, head)
    // compares cost a decode over per_token_head e4m3 pages (llama3 8B, 16 x 4096) ~18 % of
    // its time on two threads, before this pass.
    const auto* bits = reinterpret_cast<const uint32_t*>(base + offset + first_row * row_stride);
    uint32_t bad = 0;
    for (int64_t i = 0; i < n * heads; ++i)
      bad |= static_cast<uint32_t>(bits[i] - 1u >= 0x7F7FFFFFu);
    if (!bad) return Status::Ok();
  }
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
        const int64_t pages = (kv_len + p.page_size - 1) / p.page_size;
        for (int64_t j = 0; j < kv_len; j += p.page_size) {
          const int64_t page = index_at(a.kv_indices, first + j / p.page_size);
          // The pages lie anywhere: the one kAhead on is asked for now (in flight while these
          // are checked; one page after another on demand, the pass took ~2x the time).
          constexpr int64_t kAhead = 4;
          if (j / p.page_size + kAhead < pages) {
            const int64_t ahead = index_at(a.kv_indices, first + j / p.page_size + kAhead);
            const auto* block =
                reinterpret_cast<const char*>(t.as<const float>() + ahead * t.strides[0]);
            const int64_t bytes = p.page_size * t.strides[1] * int64_t{sizeof(float)};
            for (int64_t b0 = 0; b0 < std::min<int64_t>(bytes, 4096); b0 += 64) {
              __builtin_prefetch(block + b0);
            }
          }
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

Status check_run_scalars(const Problem& p, const RunScalars& s) {
  const std::pair<const char*, float> scales[] = {
      {"q_scale", s.q_scale}, {"k_scale", s.k_scale}, {"v_scale", s.v_scale}};
  for (const auto& [name, value] : scales) {
    if (!std::isfinite(value) || value <= 0.0f) {
      return make_error(ErrorCode::kInvalidScale, name, " = ", value,
                        ": must be finite and positive");
    }
  }
  if (p.kv_scale_granularity != KVScaleGranularity::kPerTensor &&
      (s.k_scale != 1.0f || s.v_scale != 1.0f)) {
    return make_error(ErrorCode::kInvalidScale, "k_scale = ", s.k_scale, ", v_scale = ", s.v_scale,
                      ": must be 1 with kv_scale_granularity ",
                      kv_scale_granularity_name(p.kv_scale_granularity),
                      " (the scale tensors carry the scales)");
  }
  if (is_mla(p.op) && (s.q_scale != 1.0f || s.v_scale != 1.0f)) {
    return make_error(ErrorCode::kInvalidScale, "q_scale = ", s.q_scale, ", v_scale = ", s.v_scale,
                      ": must be 1 for batch_mla_paged (k_scale scales both ckv and kpe)");
  }
  if (s.lse_base != LseBase::kE && s.lse_base != LseBase::k2) {
    return make_error(ErrorCode::kInvalidArgument, "lse_base = ", static_cast<int>(s.lse_base),
                      ": expected LseBase::kE or LseBase::k2");
  }
  return Status::Ok();
}

Status check_sinks_and_scales(const Problem& p, const AttentionArgs& a, int64_t kv_rows,
                              bool data_optional) {
  const bool per_head = p.kv_scale_granularity == KVScaleGranularity::kPerHead;
  const bool per_token = p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead;
  // Planning a batch operation reads none of these: absent then, they are checked at run.
  auto present = [&](const TensorView& t, const char* name, bool wanted, const char* why) {
    if (data_optional && wanted && t.empty()) return Status::Ok();
    return check_present(t, name, wanted, why);
  };
  // use_sinks says a layer may pass sinks: absent, the layer has none.
  if (!a.sinks.empty() && !p.use_sinks) {
    return make_error(ErrorCode::kInvalidArgument,
                      "sinks: given, but use_sinks is false (plan with use_sinks=true; never a "
                      "silently ignored input)");
  }
  if (!a.sinks.empty()) KVATTN_RETURN_IF_ERROR(check_view(a.sinks, "sinks"));
  KVATTN_RETURN_IF_ERROR(
      present(a.k_scale, "k_scale", per_head, "kv_scale_granularity is per_head"));
  KVATTN_RETURN_IF_ERROR(
      present(a.v_scale, "v_scale", per_head, "kv_scale_granularity is per_head"));
  KVATTN_RETURN_IF_ERROR(present(a.k_scale_cache, "k_scale_cache", per_token,
                                 "kv_scale_granularity is per_token_head"));
  KVATTN_RETURN_IF_ERROR(present(a.v_scale_cache, "v_scale_cache", per_token,
                                 "kv_scale_granularity is per_token_head"));
  const Named views[] = {{&a.sinks, "sinks"},
                         {&a.k_scale, "k_scale"},
                         {&a.v_scale, "v_scale"},
                         {&a.k_scale_cache, "k_scale_cache"},
                         {&a.v_scale_cache, "v_scale_cache"}};
  for (const Named& n : views) {
    if (n.view->empty()) continue;
    KVATTN_RETURN_IF_ERROR(check_dtype(*n.view, n.name, DType::kF32));
    if (!a.q.empty()) KVATTN_RETURN_IF_ERROR(check_same_memory(*n.view, n.name, a.q, "q"));
    KVATTN_RETURN_IF_ERROR(check_no_overlap(a.out, "out", *n.view, n.name));
    KVATTN_RETURN_IF_ERROR(check_no_overlap(a.lse, "lse", *n.view, n.name));
  }
  // Values in device memory are not readable here; host ones are checked.
  const bool host = a.q.memory == MemoryKind::kHost;
  if (p.use_sinks && !a.sinks.empty()) {
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
      if (n.view->empty()) continue;  // planning
      KVATTN_RETURN_IF_ERROR(
          check_shape(*n.view, n.name, "[H_kv]", {{p.num_kv_heads, "num_kv_heads"}}));
      if (host) KVATTN_RETURN_IF_ERROR(check_finite_positive(*n.view, n.name));
    }
  }
  if (per_token) {
    for (const Named& n :
         {Named{&a.k_scale_cache, "k_scale_cache"}, Named{&a.v_scale_cache, "v_scale_cache"}}) {
      const int64_t h_kv = p.num_kv_heads;
      if (n.view->empty()) continue;  // planning
      if (is_paged(p.op)) {
        // Without the cache (planning) the page count is whatever the scale tensor holds.
        const int64_t pages = a.paged_k_cache.empty() ? -1 : a.paged_k_cache.shape[0];
        KVATTN_RETURN_IF_ERROR(check_shape(*n.view, n.name, "[num_pages, page_size, H_kv]",
                                           {{pages, "num_pages of the cache"},
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
      // Values are read at run, where the page ids are proven against the cache they index.
      if (host && !data_optional) {
        KVATTN_RETURN_IF_ERROR(check_scale_cache_values(p, a, *n.view, n.name));
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvattn::validation
