// validate_attention: the tensors of one attention call against its Problem (DESIGN.md §4).
// Order matters: every view is proven to lie inside its buffer before an index tensor is read,
// and the page table is proven consistent before the sizes it implies are used.
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/status_macros.h"
#include "core/validate.h"
#include "core/validate_tensor.h"
#include "core/validate_variants.h"

namespace kvattn {
namespace {

using validation::check_dtype;
using validation::check_given;
using validation::check_host;
using validation::check_index_tensor;
using validation::check_no_overlap;
using validation::check_same_memory;
using validation::check_shape;
using validation::check_unused;
using validation::checked_add;
using validation::checked_mul;
using validation::index_at;

// Plans index query rows with int32 (WorkItem::qo_begin/qo_end), as the int32 indptrs do.
constexpr int64_t kMaxQueryRows = std::numeric_limits<int32_t>::max();

struct NamedView {
  const TensorView* view;
  const char* name;
};

// What an operation reads, derived from the problem alone.
struct Usage {
  bool single_kv;  // k, v: single ops [kv_len, H_kv, D] (or HND)
  bool ragged_kv;  // k, v: [kv_indptr[B], H_kv, D]
  bool paged;      // paged caches and the page table
  bool ragged_q;   // qo_indptr
};

Usage usage_of(Op op) {
  Usage u{};
  u.single_kv = !is_batch(op);
  u.ragged_kv = op == Op::kBatchPrefillRagged;
  u.paged = is_paged(op);
  u.ragged_q = op == Op::kBatchPrefillPaged || op == Op::kBatchPrefillRagged;
  return u;
}

Status check_role(const TensorView& t, const char* name, bool needed, std::string_view op) {
  return needed ? check_given(t, name, op) : check_unused(t, name, op);
}

// Presence (used arguments given, unused ones empty) and the rules of each view on its own.
// Planning a batch operation reads only the index tensors: its data tensors may be absent then
// (FlashInfer's plan takes none), and are checked when given.
Status check_presence(const Problem& p, const AttentionArgs& a, const Usage& u, ArgsScope scope) {
  const std::string_view op = op_name(p.op);
  const bool data_optional = scope == ArgsScope::kPlan && is_batch(p.op);
  auto data_role = [&](const TensorView& t, const char* name, bool needed) {
    if (data_optional && needed && t.empty()) return Status::Ok();
    return check_role(t, name, needed, op);
  };
  KVATTN_RETURN_IF_ERROR(data_role(a.q, "q", true));
  KVATTN_RETURN_IF_ERROR(data_role(a.out, "out", true));
  const bool kv = u.single_kv || u.ragged_kv;
  KVATTN_RETURN_IF_ERROR(data_role(a.k, "k", kv));
  KVATTN_RETURN_IF_ERROR(data_role(a.v, "v", kv));
  KVATTN_RETURN_IF_ERROR(data_role(a.paged_k_cache, "paged_k_cache", u.paged));
  KVATTN_RETURN_IF_ERROR(data_role(a.paged_v_cache, "paged_v_cache", u.paged));
  KVATTN_RETURN_IF_ERROR(check_role(a.qo_indptr, "qo_indptr", u.ragged_q, op));
  KVATTN_RETURN_IF_ERROR(check_role(a.kv_indptr, "kv_indptr", u.paged || u.ragged_kv, op));
  KVATTN_RETURN_IF_ERROR(check_role(a.kv_indices, "kv_indices", u.paged, op));
  KVATTN_RETURN_IF_ERROR(check_role(a.kv_last_page_len, "kv_last_page_len", u.paged, op));

  const bool custom = p.mask_mode == MaskMode::kCustom;
  if (custom) {
    KVATTN_RETURN_IF_ERROR(check_given(a.custom_mask, "custom_mask", "mask_mode custom"));
  } else if (!a.custom_mask.empty() || a.custom_mask_packed) {
    return make_error(ErrorCode::kInvalidArgument, "custom_mask",
                      a.custom_mask.empty() ? "_packed = true" : ": given", ", but mask_mode is ",
                      mask_mode_name(p.mask_mode),
                      " (a custom mask is only read with mask_mode custom)");
  }
  if (!a.alibi_slopes.empty()) {
    if (p.pos_encoding_mode != PosEncoding::kAlibi) {
      return make_error(
          ErrorCode::kInvalidArgument, "alibi_slopes: given, but pos_encoding_mode is ",
          pos_encoding_name(p.pos_encoding_mode), " (slopes are only read with ALIBI)");
    }
    KVATTN_RETURN_IF_ERROR(validation::check_view(a.alibi_slopes, "alibi_slopes"));
  }
  // The LSE is returned exactly when an lse tensor is given (a per-layer choice).
  if (!a.lse.empty()) KVATTN_RETURN_IF_ERROR(validation::check_view(a.lse, "lse"));
  return Status::Ok();
}

// Dtypes, and where each view lives: data tensors with q, index tensors on the host.
Status check_dtypes_and_memory(const Problem& p, const AttentionArgs& a) {
  if (!a.q.empty()) KVATTN_RETURN_IF_ERROR(check_dtype(a.q, "q", p.q_dtype));
  if (!a.out.empty()) KVATTN_RETURN_IF_ERROR(check_dtype(a.out, "out", p.o_dtype));
  const NamedView kv_views[] = {{&a.k, "k"},
                                {&a.v, "v"},
                                {&a.paged_k_cache, "paged_k_cache"},
                                {&a.paged_v_cache, "paged_v_cache"}};
  for (const NamedView& nv : kv_views) {
    if (!nv.view->empty()) KVATTN_RETURN_IF_ERROR(check_dtype(*nv.view, nv.name, p.kv_dtype));
  }
  if (!a.lse.empty()) KVATTN_RETURN_IF_ERROR(check_dtype(a.lse, "lse", DType::kF32));
  if (!a.custom_mask.empty()) {
    KVATTN_RETURN_IF_ERROR(check_dtype(a.custom_mask, "custom_mask", DType::kU8));
  }
  if (!a.alibi_slopes.empty()) {
    KVATTN_RETURN_IF_ERROR(check_dtype(a.alibi_slopes, "alibi_slopes", DType::kF32));
  }
  const NamedView data_views[] = {{&a.out, "out"},
                                  {&a.k, "k"},
                                  {&a.v, "v"},
                                  {&a.paged_k_cache, "paged_k_cache"},
                                  {&a.paged_v_cache, "paged_v_cache"},
                                  {&a.custom_mask, "custom_mask"},
                                  {&a.alibi_slopes, "alibi_slopes"},
                                  {&a.lse, "lse"}};
  const NamedView& anchor = a.q.empty() ? data_views[0] : NamedView{&a.q, "q"};
  for (const NamedView& nv : data_views) {
    if (!nv.view->empty() && !anchor.view->empty()) {
      KVATTN_RETURN_IF_ERROR(check_same_memory(*nv.view, nv.name, *anchor.view, anchor.name));
    }
  }
  return Status::Ok();
}

// Query rows of the single ops, which index them with int32 like the batch ops do.
Status check_query_rows(int64_t rows) {
  if (rows > kMaxQueryRows) {
    return make_error(ErrorCode::kOverflow, "q.shape[0] = ", rows, ": must be <= ", kMaxQueryRows,
                      " (query rows are indexed with int32)");
  }
  return Status::Ok();
}

// The index tensors and what they imply: total query rows and (ragged) KV rows.
Status check_indices(const Problem& p, const AttentionArgs& a, const Usage& u, int64_t* qo_rows,
                     int64_t* kv_rows) {
  const std::string_view op = op_name(p.op);
  const int64_t batch = p.batch_size;
  if (u.ragged_q) {
    KVATTN_RETURN_IF_ERROR(check_index_tensor(a.qo_indptr, "qo_indptr", op, batch + 1, "B + 1"));
    KVATTN_RETURN_IF_ERROR(validation::check_indptr(a.qo_indptr, "qo_indptr", batch, qo_rows));
  } else if (p.op == Op::kBatchDecode) {
    *qo_rows = batch;
  } else {
    *qo_rows = p.op == Op::kSingleDecode ? 1 : a.q.shape[0];
    KVATTN_RETURN_IF_ERROR(check_query_rows(*qo_rows));
  }
  if (u.ragged_kv) {
    KVATTN_RETURN_IF_ERROR(check_index_tensor(a.kv_indptr, "kv_indptr", op, batch + 1, "B + 1"));
    KVATTN_RETURN_IF_ERROR(validation::check_indptr(a.kv_indptr, "kv_indptr", batch, kv_rows));
  }
  if (u.paged) {
    KVATTN_RETURN_IF_ERROR(check_index_tensor(a.kv_indptr, "kv_indptr", op, batch + 1, "B + 1"));
    KVATTN_RETURN_IF_ERROR(check_index_tensor(a.kv_indices, "kv_indices", op, -1, ""));
    KVATTN_RETURN_IF_ERROR(
        check_index_tensor(a.kv_last_page_len, "kv_last_page_len", op, batch, "B"));
    // The page count comes from the cache, whose shape is checked before the page table is
    // trusted to index it. A plan made without the cache bounds page ids by int32 only; run
    // checks them against the cache it is given.
    int64_t num_pages = std::numeric_limits<int32_t>::max();
    if (!a.paged_k_cache.empty()) {
      KVATTN_RETURN_IF_ERROR(check_shape(a.paged_k_cache, "paged_k_cache",
                                         "[num_pages, ...] rank 4",
                                         {{-1, ""}, {-1, ""}, {-1, ""}, {-1, ""}}));
      num_pages = a.paged_k_cache.shape[0];
    }
    KVATTN_RETURN_IF_ERROR(validation::check_page_table(
        a.kv_indptr, a.kv_indices, a.kv_last_page_len, batch, num_pages, p.page_size));
  }
  return Status::Ok();
}

// K/V and the caches against the problem's heads and dims.
Status check_kv_shapes(const Problem& p, const AttentionArgs& a, const Usage& u, int64_t kv_rows) {
  const int64_t h_kv = p.num_kv_heads, d_qk = p.head_dim_qk, d_vo = p.head_dim_vo;
  if (u.single_kv) {
    const bool nhd = p.kv_layout == KVLayout::kNHD;
    const int kv_dim = nhd ? 0 : 1;
    const int64_t kv_len = a.k.rank > kv_dim ? a.k.shape[kv_dim] : -1;
    if (nhd) {
      KVATTN_RETURN_IF_ERROR(
          check_shape(a.k, "k", "[kv_len, H_kv, D_qk] (NHD)",
                      {{-1, ""}, {h_kv, "num_kv_heads"}, {d_qk, "head_dim_qk"}}));
      KVATTN_RETURN_IF_ERROR(
          check_shape(a.v, "v", "[kv_len, H_kv, D_vo] (NHD)",
                      {{kv_len, "k's kv_len"}, {h_kv, "num_kv_heads"}, {d_vo, "head_dim_vo"}}));
    } else {
      KVATTN_RETURN_IF_ERROR(
          check_shape(a.k, "k", "[H_kv, kv_len, D_qk] (HND)",
                      {{h_kv, "num_kv_heads"}, {-1, ""}, {d_qk, "head_dim_qk"}}));
      KVATTN_RETURN_IF_ERROR(
          check_shape(a.v, "v", "[H_kv, kv_len, D_vo] (HND)",
                      {{h_kv, "num_kv_heads"}, {kv_len, "k's kv_len"}, {d_vo, "head_dim_vo"}}));
    }
  }
  if (u.ragged_kv && !(a.k.empty() && a.v.empty())) {
    // A disagreeing total is a page-table error: the indptr and the tensor cannot both be right.
    if (a.k.rank >= 1 && a.k.shape[0] != kv_rows) {
      return make_error(ErrorCode::kInvalidPageTable, "kv_indptr[", p.batch_size, "] = ", kv_rows,
                        ": must equal the rows of k = ", a.k.shape[0], " (total keys)");
    }
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.k, "k", "[kv_indptr[B], H_kv, D_qk]",
                    {{kv_rows, "kv_indptr[B]"}, {h_kv, "num_kv_heads"}, {d_qk, "head_dim_qk"}}));
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.v, "v", "[kv_indptr[B], H_kv, D_vo]",
                    {{kv_rows, "kv_indptr[B]"}, {h_kv, "num_kv_heads"}, {d_vo, "head_dim_vo"}}));
  }
  if (u.paged && !(a.paged_k_cache.empty() && a.paged_v_cache.empty())) {
    const int64_t pages = a.paged_k_cache.shape[0], ps = p.page_size;
    if (p.kv_layout == KVLayout::kNHD) {
      KVATTN_RETURN_IF_ERROR(check_shape(
          a.paged_k_cache, "paged_k_cache", "[num_pages, page_size, H_kv, D_qk] (NHD)",
          {{-1, ""}, {ps, "page_size"}, {h_kv, "num_kv_heads"}, {d_qk, "head_dim_qk"}}));
      KVATTN_RETURN_IF_ERROR(check_shape(a.paged_v_cache, "paged_v_cache",
                                         "[num_pages, page_size, H_kv, D_vo] (NHD)",
                                         {{pages, "num_pages of paged_k_cache"},
                                          {ps, "page_size"},
                                          {h_kv, "num_kv_heads"},
                                          {d_vo, "head_dim_vo"}}));
    } else {
      KVATTN_RETURN_IF_ERROR(check_shape(
          a.paged_k_cache, "paged_k_cache", "[num_pages, H_kv, page_size, D_qk] (HND)",
          {{-1, ""}, {h_kv, "num_kv_heads"}, {ps, "page_size"}, {d_qk, "head_dim_qk"}}));
      KVATTN_RETURN_IF_ERROR(check_shape(a.paged_v_cache, "paged_v_cache",
                                         "[num_pages, H_kv, page_size, D_vo] (HND)",
                                         {{pages, "num_pages of paged_k_cache"},
                                          {h_kv, "num_kv_heads"},
                                          {ps, "page_size"},
                                          {d_vo, "head_dim_vo"}}));
    }
  }
  return Status::Ok();
}

// q, out and lse against the problem and the query rows.
Status check_q_out_shapes(const Problem& p, const AttentionArgs& a, const Usage& u,
                          int64_t qo_rows) {
  const int64_t h_qo = p.num_qo_heads, d_qk = p.head_dim_qk, d_vo = p.head_dim_vo;
  if (p.op == Op::kSingleDecode) {
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.q, "q", "[H_qo, D_qk]", {{h_qo, "num_qo_heads"}, {d_qk, "head_dim_qk"}}));
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.out, "out", "[H_qo, D_vo]", {{h_qo, "num_qo_heads"}, {d_vo, "head_dim_vo"}}));
    if (!a.lse.empty()) {
      KVATTN_RETURN_IF_ERROR(check_shape(a.lse, "lse", "[H_qo]", {{h_qo, "num_qo_heads"}}));
    }
    return Status::Ok();
  }
  if (u.ragged_q && a.q.rank >= 1 && a.q.shape[0] != qo_rows) {
    return make_error(ErrorCode::kInvalidPageTable, "qo_indptr[", p.batch_size, "] = ", qo_rows,
                      ": must equal the rows of q = ", a.q.shape[0], " (total queries)");
  }
  const char* rows_meaning = u.ragged_q ? "qo_indptr[B]" : is_batch(p.op) ? "B" : "q's rows";
  // Absent only when planning (check_presence decided).
  if (!a.q.empty()) {
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.q, "q", "[N, H_qo, D_qk]",
                    {{qo_rows, rows_meaning}, {h_qo, "num_qo_heads"}, {d_qk, "head_dim_qk"}}));
  }
  if (!a.out.empty()) {
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.out, "out", "[N, H_qo, D_vo]",
                    {{qo_rows, rows_meaning}, {h_qo, "num_qo_heads"}, {d_vo, "head_dim_vo"}}));
  }
  if (!a.lse.empty()) {
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.lse, "lse", "[N, H_qo]", {{qo_rows, rows_meaning}, {h_qo, "num_qo_heads"}}));
  }
  return Status::Ok();
}

// Query and key count of request b (after the shapes and page table are checked).
void request_dims(const Problem& p, const AttentionArgs& a, int64_t b, int64_t* qo_len,
                  int64_t* kv_len) {
  switch (p.op) {
    case Op::kSingleDecode:
    case Op::kSinglePrefill:
      *qo_len = p.op == Op::kSingleDecode ? 1 : a.q.shape[0];
      *kv_len = a.k.shape[p.kv_layout == KVLayout::kNHD ? 0 : 1];
      return;
    case Op::kBatchDecode:
    case Op::kBatchPrefillPaged:
    case Op::kBatchMLAPaged:
      *qo_len = p.op == Op::kBatchDecode
                    ? 1
                    : int64_t{index_at(a.qo_indptr, b + 1)} - index_at(a.qo_indptr, b);
      *kv_len = validation::paged_kv_len(a.kv_indptr, a.kv_last_page_len, b, p.page_size);
      return;
    case Op::kBatchPrefillRagged:
      *qo_len = int64_t{index_at(a.qo_indptr, b + 1)} - index_at(a.qo_indptr, b);
      *kv_len = int64_t{index_at(a.kv_indptr, b + 1)} - index_at(a.kv_indptr, b);
      return;
  }
}

// The custom mask holds qo_len x kv_len entries per request: bytes, or bits that start each
// request at a byte boundary.
Status check_custom_mask(const Problem& p, const AttentionArgs& a) {
  int64_t required = 0;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    int64_t qo_len = 0, kv_len = 0, entries = 0;
    request_dims(p, a, b, &qo_len, &kv_len);
    if (!checked_mul(qo_len, kv_len, &entries)) {
      return make_error(ErrorCode::kOverflow, "custom_mask: request ", b, " has qo_len ", qo_len,
                        " x kv_len ", kv_len, " entries, past the int64 range");
    }
    const int64_t bytes = a.custom_mask_packed ? entries / 8 + (entries % 8 != 0) : entries;
    if (!checked_add(required, bytes, &required)) {
      return make_error(ErrorCode::kOverflow,
                        "custom_mask: the total size over the batch is past the int64 range");
    }
  }
  if (a.custom_mask.rank != 1 || a.custom_mask.shape[0] != required) {
    return make_error(ErrorCode::kInvalidShape, "custom_mask: shape ", a.custom_mask.shape_string(),
                      ": must be [", required, "] (",
                      a.custom_mask_packed ? "sum of ceil(qo_len * kv_len / 8) bytes, packed"
                                           : "sum of qo_len * kv_len bytes, unpacked",
                      ")");
  }
  return Status::Ok();
}

Status check_alibi_slopes(const Problem& p, const AttentionArgs& a) {
  const TensorView& s = a.alibi_slopes;
  KVATTN_RETURN_IF_ERROR(
      check_shape(s, "alibi_slopes", "[H_qo]", {{p.num_qo_heads, "num_qo_heads"}}));
  // Slopes in device memory are not readable here; the host ones are checked for finiteness.
  if (s.memory != MemoryKind::kHost) return Status::Ok();
  for (int64_t h = 0; h < s.shape[0]; ++h) {
    const float slope = static_cast<const float*>(s.data)[h * s.strides[0]];
    if (!std::isfinite(slope)) {
      return make_error(ErrorCode::kInvalidArgument, "alibi_slopes[", h, "] = ", slope,
                        ": must be finite");
    }
  }
  return Status::Ok();
}

// Outputs share no byte with any input, nor with each other.
Status check_aliasing(const AttentionArgs& a) {
  const NamedView inputs[] = {{&a.q, "q"},
                              {&a.k, "k"},
                              {&a.v, "v"},
                              {&a.paged_k_cache, "paged_k_cache"},
                              {&a.paged_v_cache, "paged_v_cache"},
                              {&a.qo_indptr, "qo_indptr"},
                              {&a.kv_indptr, "kv_indptr"},
                              {&a.kv_indices, "kv_indices"},
                              {&a.kv_last_page_len, "kv_last_page_len"},
                              {&a.custom_mask, "custom_mask"},
                              {&a.alibi_slopes, "alibi_slopes"}};
  const NamedView outputs[] = {{&a.out, "out"}, {&a.lse, "lse"}};
  for (const NamedView& o : outputs) {
    if (!o.view->empty()) KVATTN_RETURN_IF_ERROR(validation::check_output_layout(*o.view, o.name));
    for (const NamedView& i : inputs) {
      KVATTN_RETURN_IF_ERROR(check_no_overlap(*o.view, o.name, *i.view, i.name));
    }
  }
  return check_no_overlap(a.lse, "lse", a.out, "out");
}

}  // namespace

Status validate_attention(const Problem& problem, const AttentionArgs& args, ArgsScope scope) {
  KVATTN_RETURN_IF_ERROR(validate_problem(problem));
  KVATTN_RETURN_IF_ERROR(validation::check_run_scalars(problem, args.scalars));
  if (is_mla(problem.op)) return validate_mla_attention(problem, args, scope);
  KVATTN_RETURN_IF_ERROR(check_mla_args_unused(args, op_name(problem.op)));
  const Usage usage = usage_of(problem.op);
  KVATTN_RETURN_IF_ERROR(check_presence(problem, args, usage, scope));
  KVATTN_RETURN_IF_ERROR(check_dtypes_and_memory(problem, args));
  int64_t qo_rows = 0, kv_rows = 0;
  KVATTN_RETURN_IF_ERROR(check_indices(problem, args, usage, &qo_rows, &kv_rows));
  KVATTN_RETURN_IF_ERROR(check_kv_shapes(problem, args, usage, kv_rows));
  KVATTN_RETURN_IF_ERROR(check_q_out_shapes(problem, args, usage, qo_rows));
  if (problem.mask_mode == MaskMode::kCustom) {
    KVATTN_RETURN_IF_ERROR(check_custom_mask(problem, args));
  }
  if (!args.alibi_slopes.empty()) KVATTN_RETURN_IF_ERROR(check_alibi_slopes(problem, args));
  KVATTN_RETURN_IF_ERROR(check_aliasing(args));
  return validation::check_sinks_and_scales(problem, args, kv_rows,
                                            scope == ArgsScope::kPlan && is_batch(problem.op));
}

Status validate_plan(const Plan& plan) {
  const Problem& p = plan.problem;
  const std::size_t batch = static_cast<std::size_t>(is_batch(p.op) ? p.batch_size : 1);
  if (plan.qo_len.size() != batch || plan.kv_len.size() != batch) {
    return make_error(ErrorCode::kInvalidArgument, "plan: lengths for ", plan.qo_len.size(), " / ",
                      plan.kv_len.size(), " requests: must be for batch_size = ", batch,
                      " (was the plan made by kvattn::plan?)");
  }
  if (plan.num_threads < 0 || plan.kv_chunk_size < 0 || plan.num_partial_states < 0) {
    return make_error(ErrorCode::kInvalidArgument, "plan: num_threads = ", plan.num_threads,
                      ", kv_chunk_size = ", plan.kv_chunk_size,
                      ", num_partial_states = ", plan.num_partial_states, ": must be >= 0");
  }
  for (std::size_t i = 0; i < plan.work.size(); ++i) {
    const WorkItem& w = plan.work[i];
    if (w.request < 0 || static_cast<std::size_t>(w.request) >= batch || w.kv_head < 0 ||
        w.kv_head >= p.num_kv_heads || w.partial < -1) {
      return make_error(ErrorCode::kInvalidArgument, "plan.work[", i, "]: request ", w.request,
                        ", kv_head ", w.kv_head, ", partial ", w.partial, ": must be in [0, ",
                        batch, "), [0, ", p.num_kv_heads, ") and >= -1");
    }
    const int64_t qo_len = plan.qo_len[w.request], kv_len = plan.kv_len[w.request];
    if (w.qo_begin < 0 || w.qo_begin > w.qo_end || w.qo_end > qo_len || w.kv_begin < 0 ||
        w.kv_begin > w.kv_end || w.kv_end > kv_len) {
      return make_error(ErrorCode::kInvalidArgument, "plan.work[", i, "]: queries [", w.qo_begin,
                        ", ", w.qo_end, ") and keys [", w.kv_begin, ", ", w.kv_end,
                        "): must lie in [0, ", qo_len, ") and [0, ", kv_len, ") of request ",
                        w.request);
    }
  }
  return Status::Ok();
}

}  // namespace kvattn
