// Validation of MLA (batch_mla_paged and append_paged_mla_kv_cache), DESIGN.md §2 "MLA" and §4:
// the problem's latent widths and the fields MLA fixes, then the tensors, views before contents.
#include <limits>
#include <string>
#include <utility>

#include "core/status_macros.h"
#include "core/validate.h"
#include "core/validate_tensor.h"

namespace kvattn {
namespace {

using validation::check_dtype;
using validation::check_given;
using validation::check_index_tensor;
using validation::check_no_overlap;
using validation::check_same_memory;
using validation::check_shape;
using validation::check_unused;

constexpr std::string_view kOp = "batch_mla_paged";
constexpr int kMaxLatentDim = 1024;
constexpr int kMinHeads = 16, kMaxHeads = 128;

struct NamedView {
  const TensorView* view;
  const char* name;
};

// Planning reads the index tensors only: the data tensors (q_nope, q_pe, the caches, out, lse)
// may be absent then and are checked when given; run checks all of them.
Status check_presence(const AttentionArgs& a, ArgsScope scope) {
  const bool data_optional = scope == ArgsScope::kPlan;
  const NamedView index[] = {{&a.qo_indptr, "qo_indptr"},
                             {&a.kv_indptr, "kv_indptr"},
                             {&a.kv_indices, "kv_indices"},
                             {&a.kv_last_page_len, "kv_last_page_len"}};
  for (const NamedView& nv : index) KVATTN_RETURN_IF_ERROR(check_given(*nv.view, nv.name, kOp));
  const NamedView data[] = {{&a.q_nope, "q_nope"},
                            {&a.q_pe, "q_pe"},
                            {&a.ckv_cache, "ckv_cache"},
                            {&a.kpe_cache, "kpe_cache"},
                            {&a.out, "out"}};
  for (const NamedView& nv : data) {
    if (data_optional && nv.view->empty()) continue;
    KVATTN_RETURN_IF_ERROR(check_given(*nv.view, nv.name, kOp));
  }
  const NamedView unused[] = {{&a.q, "q"},
                              {&a.k, "k"},
                              {&a.v, "v"},
                              {&a.paged_k_cache, "paged_k_cache"},
                              {&a.paged_v_cache, "paged_v_cache"},
                              {&a.custom_mask, "custom_mask"},
                              {&a.alibi_slopes, "alibi_slopes"},
                              // MLA has no sink and one per-tensor k_scale (DESIGN.md §2)
                              {&a.sinks, "sinks"},
                              {&a.k_scale, "k_scale"},
                              {&a.v_scale, "v_scale"},
                              {&a.k_scale_cache, "k_scale_cache"},
                              {&a.v_scale_cache, "v_scale_cache"}};
  for (const NamedView& nv : unused) KVATTN_RETURN_IF_ERROR(check_unused(*nv.view, nv.name, kOp));
  if (a.custom_mask_packed) {
    return make_error(ErrorCode::kInvalidArgument,
                      "custom_mask_packed = true, but batch_mla_paged takes no custom mask");
  }
  if (!a.lse.empty()) KVATTN_RETURN_IF_ERROR(validation::check_view(a.lse, "lse"));
  return Status::Ok();
}

Status check_dtypes_and_memory(const Problem& p, const AttentionArgs& a) {
  // Empty views are absent only when planning (check_presence decided).
  const std::pair<const NamedView, DType> typed[] = {{{&a.q_nope, "q_nope"}, p.q_dtype},
                                                     {{&a.q_pe, "q_pe"}, p.q_dtype},
                                                     {{&a.ckv_cache, "ckv_cache"}, p.kv_dtype},
                                                     {{&a.kpe_cache, "kpe_cache"}, p.kv_dtype},
                                                     {{&a.out, "out"}, p.o_dtype},
                                                     {{&a.lse, "lse"}, DType::kF32}};
  for (const auto& [nv, dtype] : typed) {
    if (!nv.view->empty()) KVATTN_RETURN_IF_ERROR(check_dtype(*nv.view, nv.name, dtype));
  }
  if (a.q_nope.empty()) return Status::Ok();
  const NamedView data[] = {{&a.q_pe, "q_pe"},
                            {&a.ckv_cache, "ckv_cache"},
                            {&a.kpe_cache, "kpe_cache"},
                            {&a.out, "out"},
                            {&a.lse, "lse"}};
  for (const NamedView& nv : data) {
    if (!nv.view->empty()) {
      KVATTN_RETURN_IF_ERROR(check_same_memory(*nv.view, nv.name, a.q_nope, "q_nope"));
    }
  }
  return Status::Ok();
}

Status check_shapes_and_page_table(const Problem& p, const AttentionArgs& a) {
  const int64_t batch = p.batch_size, h = p.num_qo_heads, ps = p.page_size;
  const int64_t d_ckv = p.head_dim_ckv, d_kpe = p.head_dim_kpe;
  KVATTN_RETURN_IF_ERROR(check_index_tensor(a.qo_indptr, "qo_indptr", kOp, batch + 1, "B + 1"));
  int64_t qo_rows = 0;
  KVATTN_RETURN_IF_ERROR(validation::check_indptr(a.qo_indptr, "qo_indptr", batch, &qo_rows));
  KVATTN_RETURN_IF_ERROR(check_index_tensor(a.kv_indptr, "kv_indptr", kOp, batch + 1, "B + 1"));
  KVATTN_RETURN_IF_ERROR(check_index_tensor(a.kv_indices, "kv_indices", kOp, -1, ""));
  KVATTN_RETURN_IF_ERROR(
      check_index_tensor(a.kv_last_page_len, "kv_last_page_len", kOp, batch, "B"));
  // The caches fix the page count before the page table is trusted to index them; a plan made
  // without them bounds page ids by int32 only (run checks them against the caches).
  int64_t pages = std::numeric_limits<int32_t>::max();
  if (!a.ckv_cache.empty() || !a.kpe_cache.empty()) {
    KVATTN_RETURN_IF_ERROR(check_shape(a.ckv_cache, "ckv_cache", "[num_pages, page_size, D_ckv]",
                                       {{-1, ""}, {ps, "page_size"}, {d_ckv, "head_dim_ckv"}}));
    pages = a.ckv_cache.shape[0];
    KVATTN_RETURN_IF_ERROR(check_shape(
        a.kpe_cache, "kpe_cache", "[num_pages, page_size, D_kpe]",
        {{pages, "num_pages of ckv_cache"}, {ps, "page_size"}, {d_kpe, "head_dim_kpe"}}));
  }
  KVATTN_RETURN_IF_ERROR(validation::check_page_table(a.kv_indptr, a.kv_indices, a.kv_last_page_len,
                                                      batch, pages, ps));
  // Empty views are absent only when planning (check_presence decided).
  if (!a.q_nope.empty() && a.q_nope.rank >= 1 && a.q_nope.shape[0] != qo_rows) {
    return make_error(ErrorCode::kInvalidPageTable, "qo_indptr[", batch, "] = ", qo_rows,
                      ": must equal the rows of q_nope = ", a.q_nope.shape[0], " (total queries)");
  }
  const std::initializer_list<validation::DimRule> ckv_rows = {
      {qo_rows, "qo_indptr[B]"}, {h, "num_qo_heads"}, {d_ckv, "head_dim_ckv"}};
  if (!a.q_nope.empty()) {
    KVATTN_RETURN_IF_ERROR(check_shape(a.q_nope, "q_nope", "[N, H, D_ckv]", ckv_rows));
  }
  if (!a.q_pe.empty()) {
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.q_pe, "q_pe", "[N, H, D_kpe]",
                    {{qo_rows, "qo_indptr[B]"}, {h, "num_qo_heads"}, {d_kpe, "head_dim_kpe"}}));
  }
  if (!a.out.empty()) {
    KVATTN_RETURN_IF_ERROR(check_shape(a.out, "out", "[N, H, D_ckv]", ckv_rows));
  }
  if (!a.lse.empty()) {
    KVATTN_RETURN_IF_ERROR(
        check_shape(a.lse, "lse", "[N, H]", {{qo_rows, "qo_indptr[B]"}, {h, "num_qo_heads"}}));
  }
  return Status::Ok();
}

Status check_aliasing(const AttentionArgs& a) {
  const NamedView inputs[] = {
      {&a.q_nope, "q_nope"},         {&a.q_pe, "q_pe"},
      {&a.ckv_cache, "ckv_cache"},   {&a.kpe_cache, "kpe_cache"},
      {&a.qo_indptr, "qo_indptr"},   {&a.kv_indptr, "kv_indptr"},
      {&a.kv_indices, "kv_indices"}, {&a.kv_last_page_len, "kv_last_page_len"}};
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

Status validate_mla_problem(const Problem& p) {
  if (p.head_dim_ckv <= 0 || p.head_dim_ckv > kMaxLatentDim) {
    return make_error(ErrorCode::kInvalidShape, "head_dim_ckv = ", p.head_dim_ckv,
                      ": must be in [1, ", kMaxLatentDim, "] (DeepSeek-V2/V3: 512)");
  }
  // head_dim_kpe 0 (no positional part: s = q_nope · ckv only) is accepted, as FlashInfer does.
  if (p.head_dim_kpe < 0 || p.head_dim_kpe > kMaxLatentDim) {
    return make_error(ErrorCode::kInvalidShape, "head_dim_kpe = ", p.head_dim_kpe,
                      ": must be in [0, ", kMaxLatentDim, "] (DeepSeek-V2/V3: 64; 0: no pe term)");
  }
  // The fields MLA fixes, so that shape-generic code sees one latent KV head.
  if (p.num_kv_heads != 1) {
    return make_error(ErrorCode::kInvalidShape, "num_kv_heads = ", p.num_kv_heads,
                      ": must be 1 for batch_mla_paged (one latent shared by all heads; "
                      "make_mla_problem / derive_mla_fields set it)");
  }
  if (p.head_dim_qk != p.head_dim_ckv + p.head_dim_kpe) {
    return make_error(ErrorCode::kInvalidShape, "head_dim_qk = ", p.head_dim_qk,
                      ": must be head_dim_ckv + head_dim_kpe = ", p.head_dim_ckv + p.head_dim_kpe,
                      " for batch_mla_paged");
  }
  if (p.head_dim_vo != p.head_dim_ckv) {
    return make_error(ErrorCode::kInvalidShape, "head_dim_vo = ", p.head_dim_vo,
                      ": must be head_dim_ckv = ", p.head_dim_ckv, " for batch_mla_paged");
  }
  // DESIGN.md §2 defines MLA with one k_scale for both latents and no sink.
  if (p.use_sinks) {
    return make_error(ErrorCode::kInvalidArgument,
                      "use_sinks: true, but batch_mla_paged defines no attention sink");
  }
  if (p.kv_scale_granularity != KVScaleGranularity::kPerTensor) {
    return make_error(ErrorCode::kInvalidArgument, "kv_scale_granularity ",
                      kv_scale_granularity_name(p.kv_scale_granularity),
                      ": batch_mla_paged takes one per-tensor k_scale for ckv and kpe");
  }
  if (p.kv_layout != KVLayout::kNHD) {
    return make_error(
        ErrorCode::kInvalidArgument, "kv_layout ", kv_layout_name(p.kv_layout),
        ": must be NHD for batch_mla_paged (the latent caches are [P, page_size, D])");
  }
  if (p.num_qo_heads < kMinHeads || p.num_qo_heads > kMaxHeads) {
    return make_error(ErrorCode::kInvalidShape, "num_qo_heads = ", p.num_qo_heads, ": must be in [",
                      kMinHeads, ", ", kMaxHeads, "] for batch_mla_paged");
  }
  if (!p.sm_scale) {
    return make_error(ErrorCode::kInvalidArgument,
                      "sm_scale: not given; batch_mla_paged has no default (the model's "
                      "1/sqrt(192) * mscale^2 for DeepSeek-V3)");
  }
  if (!is_16bit_float(p.q_dtype)) {
    return make_error(ErrorCode::kInvalidDType, "q dtype ", dtype_name(p.q_dtype),
                      ": must be f16 or bf16 for batch_mla_paged");
  }
  if (p.kv_dtype == DType::kF32) {
    return make_error(ErrorCode::kInvalidDType, "kv dtype f32",
                      ": must be f16, bf16, e4m3 or e5m2 for batch_mla_paged");
  }
  // q's dtype as in FlashInfer; f32 too, for a reference output that is not rounded.
  if (p.o_dtype != p.q_dtype && p.o_dtype != DType::kF32) {
    return make_error(ErrorCode::kInvalidDType, "o dtype ", dtype_name(p.o_dtype),
                      ": must be q's dtype ", dtype_name(p.q_dtype),
                      " (or f32) for batch_mla_paged");
  }
  if (p.mask_mode == MaskMode::kCustom) {
    return make_error(ErrorCode::kInvalidArgument,
                      "mask_mode custom: batch_mla_paged takes none or causal");
  }
  // Variants MLA does not define: refused rather than silently ignored.
  if (p.window_left >= 0 || p.logits_soft_cap > 0 || p.pos_encoding_mode != PosEncoding::kNone ||
      p.use_fp16_qk_reduction) {
    return make_error(ErrorCode::kInvalidArgument, "window_left = ", p.window_left,
                      ", logits_soft_cap = ", p.logits_soft_cap, ", pos_encoding_mode ",
                      pos_encoding_name(p.pos_encoding_mode),
                      ", use_fp16_qk_reduction = ", p.use_fp16_qk_reduction,
                      ": batch_mla_paged defines none of these (-1, 0, NONE, false)");
  }
  return Status::Ok();
}

Status validate_mla_attention(const Problem& problem, const AttentionArgs& args,
                              ArgsScope scope) {
  KVATTN_RETURN_IF_ERROR(check_presence(args, scope));
  KVATTN_RETURN_IF_ERROR(check_dtypes_and_memory(problem, args));
  KVATTN_RETURN_IF_ERROR(check_shapes_and_page_table(problem, args));
  return check_aliasing(args);
}

Status check_mla_args_unused(const AttentionArgs& a, std::string_view op) {
  const NamedView mla[] = {{&a.q_nope, "q_nope"},
                           {&a.q_pe, "q_pe"},
                           {&a.ckv_cache, "ckv_cache"},
                           {&a.kpe_cache, "kpe_cache"}};
  for (const NamedView& nv : mla) KVATTN_RETURN_IF_ERROR(check_unused(*nv.view, nv.name, op));
  return Status::Ok();
}

Status validate_append_paged_mla_kv_cache(const TensorView& append_ckv,
                                          const TensorView& append_kpe,
                                          const PagedMLACache& cache) {
  constexpr std::string_view op = "append_paged_mla_kv_cache";
  const NamedView data[] = {{&append_ckv, "append_ckv"},
                            {&append_kpe, "append_kpe"},
                            {&cache.ckv_cache, "cache.ckv_cache"},
                            {&cache.kpe_cache, "cache.kpe_cache"}};
  for (const NamedView& nv : data) KVATTN_RETURN_IF_ERROR(check_given(*nv.view, nv.name, op));
  KVATTN_RETURN_IF_ERROR(
      check_shape(append_ckv, "append_ckv", "[nnz, D_ckv]", {{-1, ""}, {-1, ""}}));
  KVATTN_RETURN_IF_ERROR(check_shape(append_kpe, "append_kpe", "[nnz, D_kpe]",
                                     {{append_ckv.shape[0], "nnz of append_ckv"}, {-1, ""}}));
  KVATTN_RETURN_IF_ERROR(
      check_shape(cache.ckv_cache, "cache.ckv_cache", "[num_pages, page_size, D_ckv]",
                  {{-1, ""}, {-1, ""}, {append_ckv.shape[1], "D_ckv of append_ckv"}}));
  return check_shape(cache.kpe_cache, "cache.kpe_cache", "[num_pages, page_size, D_kpe]",
                     {{cache.ckv_cache.shape[0], "num_pages of ckv_cache"},
                      {cache.ckv_cache.shape[1], "page_size of ckv_cache"},
                      {append_kpe.shape[1], "D_kpe of append_kpe"}});
}

}  // namespace kvattn
