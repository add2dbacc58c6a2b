// Validation of the operations that are not attention: merge_state(s), append_paged_kv_cache,
// apply_rope (DESIGN.md §4). Same order as validate_attention: views first, then contents.
#include <cmath>
#include <cstdint>

#include "core/status_macros.h"
#include "core/validate.h"
#include "core/validate_tensor.h"

namespace kvattn {
namespace {

using validation::check_dtype;
using validation::check_given;
using validation::check_host;
using validation::check_index_tensor;
using validation::check_no_overlap;
using validation::check_output_layout;
using validation::check_same_memory;
using validation::check_shape;
using validation::check_view;
using validation::DimRule;
using validation::index_at;

struct NamedView {
  const TensorView* view;
  const char* name;
};

// Values (attention outputs, states, rotated q/k, appended k/v) are f32, f16 or bf16.
Status check_value_dtype(const TensorView& t, std::string_view name) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
    return make_error(ErrorCode::kInvalidDType, name, ": dtype ", dtype_name(t.dtype),
                      ": must be f32, f16 or bf16");
  }
  return Status::Ok();
}

Status check_positive_scale(const char* name, float value) {
  if (!std::isfinite(value) || value <= 0.0f) {
    return make_error(ErrorCode::kInvalidScale, name, " = ", value,
                      ": must be finite and positive");
  }
  return Status::Ok();
}

// Every output (with its own layout checked) against every input and every other output.
template <std::size_t NO, std::size_t NI>
Status check_outputs(const NamedView (&outputs)[NO], const NamedView (&inputs)[NI]) {
  for (std::size_t o = 0; o < NO; ++o) {
    if (outputs[o].view->empty()) continue;
    KVATTN_RETURN_IF_ERROR(check_output_layout(*outputs[o].view, outputs[o].name));
    for (const NamedView& in : inputs) {
      KVATTN_RETURN_IF_ERROR(
          check_no_overlap(*outputs[o].view, outputs[o].name, *in.view, in.name));
    }
    for (std::size_t other = 0; other < o; ++other) {
      KVATTN_RETURN_IF_ERROR(check_no_overlap(*outputs[o].view, outputs[o].name,
                                              *outputs[other].view, outputs[other].name));
    }
  }
  return Status::Ok();
}

bool same_view(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rank == b.rank && a.shape == b.shape &&
         a.strides == b.strides && a.memory == b.memory && a.device_index == b.device_index;
}

}  // namespace

Status validate_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                            const TensorView& s_b, const TensorView& v_out,
                            const TensorView& s_out) {
  constexpr std::string_view op = "merge_state";
  const NamedView all[] = {{&v_a, "v_a"}, {&s_a, "s_a"},     {&v_b, "v_b"},
                           {&s_b, "s_b"}, {&v_out, "v_out"}, {&s_out, "s_out"}};
  for (const NamedView& nv : all) KVATTN_RETURN_IF_ERROR(check_given(*nv.view, nv.name, op));
  for (const NamedView& nv : all) {
    KVATTN_RETURN_IF_ERROR(check_same_memory(*nv.view, nv.name, v_a, "v_a"));
  }
  KVATTN_RETURN_IF_ERROR(check_shape(v_a, "v_a", "[N, H, D]", {{-1, ""}, {-1, ""}, {-1, ""}}));
  const int64_t n = v_a.shape[0], h = v_a.shape[1], d = v_a.shape[2];
  const std::initializer_list<DimRule> value_dims = {
      {n, "N of v_a"}, {h, "H of v_a"}, {d, "D of v_a"}};
  const std::initializer_list<DimRule> state_dims = {{n, "N of v_a"}, {h, "H of v_a"}};
  KVATTN_RETURN_IF_ERROR(check_shape(v_b, "v_b", "[N, H, D]", value_dims));
  KVATTN_RETURN_IF_ERROR(check_shape(v_out, "v_out", "[N, H, D]", value_dims));
  KVATTN_RETURN_IF_ERROR(check_shape(s_a, "s_a", "[N, H]", state_dims));
  KVATTN_RETURN_IF_ERROR(check_shape(s_b, "s_b", "[N, H]", state_dims));
  KVATTN_RETURN_IF_ERROR(check_shape(s_out, "s_out", "[N, H]", state_dims));
  for (const NamedView& nv : {NamedView{&v_a, "v_a"}, {&v_b, "v_b"}, {&v_out, "v_out"}}) {
    KVATTN_RETURN_IF_ERROR(check_value_dtype(*nv.view, nv.name));
  }
  for (const NamedView& nv : {NamedView{&s_a, "s_a"}, {&s_b, "s_b"}, {&s_out, "s_out"}}) {
    KVATTN_RETURN_IF_ERROR(check_dtype(*nv.view, nv.name, DType::kF32));
  }
  const NamedView outputs[] = {{&v_out, "v_out"}, {&s_out, "s_out"}};
  const NamedView inputs[] = {{&v_a, "v_a"}, {&s_a, "s_a"}, {&v_b, "v_b"}, {&s_b, "s_b"}};
  return check_outputs(outputs, inputs);
}

Status validate_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                             const TensorView& s_out) {
  constexpr std::string_view op = "merge_states";
  KVATTN_RETURN_IF_ERROR(check_given(v, "v", op));
  KVATTN_RETURN_IF_ERROR(check_given(s, "s", op));
  KVATTN_RETURN_IF_ERROR(check_given(v_out, "v_out", op));
  if (!s_out.empty()) KVATTN_RETURN_IF_ERROR(validation::check_view(s_out, "s_out"));
  for (const NamedView& nv : {NamedView{&s, "s"}, {&v_out, "v_out"}, {&s_out, "s_out"}}) {
    if (!nv.view->empty()) KVATTN_RETURN_IF_ERROR(check_same_memory(*nv.view, nv.name, v, "v"));
  }
  KVATTN_RETURN_IF_ERROR(
      check_shape(v, "v", "[N, S, H, D]", {{-1, ""}, {-1, ""}, {-1, ""}, {-1, ""}}));
  const int64_t n = v.shape[0], num_states = v.shape[1], h = v.shape[2], d = v.shape[3];
  KVATTN_RETURN_IF_ERROR(
      check_shape(s, "s", "[N, S, H]", {{n, "N of v"}, {num_states, "S of v"}, {h, "H of v"}}));
  KVATTN_RETURN_IF_ERROR(
      check_shape(v_out, "v_out", "[N, H, D]", {{n, "N of v"}, {h, "H of v"}, {d, "D of v"}}));
  if (!s_out.empty()) {
    KVATTN_RETURN_IF_ERROR(check_shape(s_out, "s_out", "[N, H]", {{n, "N of v"}, {h, "H of v"}}));
    KVATTN_RETURN_IF_ERROR(check_dtype(s_out, "s_out", DType::kF32));
  }
  KVATTN_RETURN_IF_ERROR(check_value_dtype(v, "v"));
  KVATTN_RETURN_IF_ERROR(check_value_dtype(v_out, "v_out"));
  KVATTN_RETURN_IF_ERROR(check_dtype(s, "s", DType::kF32));
  const NamedView outputs[] = {{&v_out, "v_out"}, {&s_out, "s_out"}};
  const NamedView inputs[] = {{&v, "v"}, {&s, "s"}};
  return check_outputs(outputs, inputs);
}

Status validate_append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                                      const TensorView& batch_indices, const TensorView& positions,
                                      const PagedKVCache& cache) {
  constexpr std::string_view op = "append_paged_kv_cache";
  KVATTN_RETURN_IF_ERROR(check_positive_scale("cache.k_scale", cache.k_scale));
  KVATTN_RETURN_IF_ERROR(check_positive_scale("cache.v_scale", cache.v_scale));
  if (cache.layout != KVLayout::kNHD && cache.layout != KVLayout::kHND) {
    return make_error(ErrorCode::kInvalidArgument, "cache.layout code ",
                      static_cast<int>(cache.layout), ": must be NHD or HND");
  }
  const NamedView data[] = {{&append_k, "append_k"},
                            {&append_v, "append_v"},
                            {&cache.k_cache, "cache.k_cache"},
                            {&cache.v_cache, "cache.v_cache"}};
  for (const NamedView& nv : data) KVATTN_RETURN_IF_ERROR(check_given(*nv.view, nv.name, op));
  for (const NamedView& nv : data) {
    KVATTN_RETURN_IF_ERROR(check_same_memory(*nv.view, nv.name, append_k, "append_k"));
  }
  KVATTN_RETURN_IF_ERROR(check_value_dtype(append_k, "append_k"));
  KVATTN_RETURN_IF_ERROR(check_value_dtype(append_v, "append_v"));
  if (!is_float(cache.k_cache.dtype)) {
    return make_error(ErrorCode::kInvalidDType, "cache.k_cache: dtype ",
                      dtype_name(cache.k_cache.dtype), ": must be a floating-point type");
  }
  KVATTN_RETURN_IF_ERROR(check_dtype(cache.v_cache, "cache.v_cache", cache.k_cache.dtype));

  // The cache fixes the page count, page size, heads and dims; everything else must agree.
  const bool nhd = cache.layout == KVLayout::kNHD;
  const char* k_layout =
      nhd ? "[num_pages, page_size, H_kv, D_k] (NHD)" : "[num_pages, H_kv, page_size, D_k] (HND)";
  const char* v_layout =
      nhd ? "[num_pages, page_size, H_kv, D_v] (NHD)" : "[num_pages, H_kv, page_size, D_v] (HND)";
  KVATTN_RETURN_IF_ERROR(check_shape(cache.k_cache, "cache.k_cache", k_layout,
                                     {{-1, ""}, {-1, ""}, {-1, ""}, {-1, ""}}));
  const TensorView& kc = cache.k_cache;
  const int64_t num_pages = kc.shape[0], page_size = kc.shape[nhd ? 1 : 2];
  const int64_t h_kv = kc.shape[nhd ? 2 : 1], d_k = kc.shape[3];
  if (page_size < 1) {
    return make_error(ErrorCode::kInvalidShape, "cache.k_cache: page_size = ", page_size,
                      ": must be >= 1");
  }
  KVATTN_RETURN_IF_ERROR(
      check_shape(append_k, "append_k", "[nnz, H_kv, D_k]",
                  {{-1, ""}, {h_kv, "H_kv of the cache"}, {d_k, "D_k of the cache"}}));
  const int64_t nnz = append_k.shape[0];
  KVATTN_RETURN_IF_ERROR(
      check_shape(append_v, "append_v", "[nnz, H_kv, D_v]",
                  {{nnz, "nnz of append_k"}, {h_kv, "H_kv of the cache"}, {-1, ""}}));
  const int64_t d_v = append_v.shape[2];
  if (nhd) {
    KVATTN_RETURN_IF_ERROR(check_shape(cache.v_cache, "cache.v_cache", v_layout,
                                       {{num_pages, "num_pages of k_cache"},
                                        {page_size, "page_size of k_cache"},
                                        {h_kv, "H_kv of k_cache"},
                                        {d_v, "D_v of append_v"}}));
  } else {
    KVATTN_RETURN_IF_ERROR(check_shape(cache.v_cache, "cache.v_cache", v_layout,
                                       {{num_pages, "num_pages of k_cache"},
                                        {h_kv, "H_kv of k_cache"},
                                        {page_size, "page_size of k_cache"},
                                        {d_v, "D_v of append_v"}}));
  }

  KVATTN_RETURN_IF_ERROR(check_index_tensor(cache.kv_indptr, "cache.kv_indptr", op, -1, ""));
  const int64_t batch = cache.kv_indptr.shape[0] - 1;
  if (batch < 0) {
    return make_error(ErrorCode::kInvalidShape, "cache.kv_indptr: shape [0]: must be [B + 1]");
  }
  KVATTN_RETURN_IF_ERROR(check_index_tensor(cache.kv_indices, "cache.kv_indices", op, -1, ""));
  KVATTN_RETURN_IF_ERROR(check_index_tensor(cache.kv_last_page_len, "cache.kv_last_page_len", op,
                                            batch, "B (kv_indptr length - 1)"));
  KVATTN_RETURN_IF_ERROR(check_index_tensor(batch_indices, "batch_indices", op, nnz, "nnz"));
  KVATTN_RETURN_IF_ERROR(check_index_tensor(positions, "positions", op, nnz, "nnz"));
  KVATTN_RETURN_IF_ERROR(validation::check_page_table(
      cache.kv_indptr, cache.kv_indices, cache.kv_last_page_len, batch, num_pages, page_size));
  for (int64_t i = 0; i < nnz; ++i) {
    const int32_t b = index_at(batch_indices, i);
    if (b == kPaddedAppendRow) continue;  // a padded row writes nothing; its position is not read
    if (b < 0 || b >= batch) {
      return make_error(ErrorCode::kOutOfBounds, "batch_indices[", i, "] = ", b,
                        ": must be in [0, B = ", batch, ") or -1 (a padded row, written nowhere)");
    }
    const int32_t pos = index_at(positions, i);
    const int64_t kv_len =
        validation::paged_kv_len(cache.kv_indptr, cache.kv_last_page_len, b, page_size);
    if (pos < 0 || pos >= kv_len) {
      return make_error(ErrorCode::kOutOfBounds, "positions[", i, "] = ", pos,
                        ": must be in [0, kv_len of request ", b, " = ", kv_len,
                        ") (the page table must already hold the appended tokens)");
    }
  }

  const bool per_token = cache.scale_granularity == KVScaleGranularity::kPerTokenHead;
  if (cache.scale_granularity == KVScaleGranularity::kPerHead) {
    return make_error(ErrorCode::kNotSupported,
                      "cache.scale_granularity per_head: append_paged_kv_cache quantizes per "
                      "tensor (cache.k_scale / v_scale) or per_token_head");
  }
  if (cache.scale_granularity != KVScaleGranularity::kPerTensor && !per_token) {
    return make_error(ErrorCode::kInvalidArgument, "cache.scale_granularity code ",
                      static_cast<int>(cache.scale_granularity),
                      ": must be per_tensor or per_token_head");
  }
  if (per_token) {
    if (!is_fp8(kc.dtype)) {
      return make_error(ErrorCode::kInvalidDType, "cache.k_cache: dtype ", dtype_name(kc.dtype),
                        ": per_token_head scales need an fp8 cache (e4m3, e5m2)");
    }
    if (cache.k_scale != 1.0f || cache.v_scale != 1.0f) {
      return make_error(ErrorCode::kInvalidScale, "cache.k_scale = ", cache.k_scale,
                        ", cache.v_scale = ", cache.v_scale,
                        ": must be 1 with per_token_head (the scales are computed per row)");
    }
    for (const NamedView& nv : {NamedView{&cache.k_scale_cache, "cache.k_scale_cache"},
                                NamedView{&cache.v_scale_cache, "cache.v_scale_cache"}}) {
      KVATTN_RETURN_IF_ERROR(check_given(*nv.view, nv.name, "per_token_head"));
      KVATTN_RETURN_IF_ERROR(check_dtype(*nv.view, nv.name, DType::kF32));
      KVATTN_RETURN_IF_ERROR(check_same_memory(*nv.view, nv.name, append_k, "append_k"));
      KVATTN_RETURN_IF_ERROR(check_shape(*nv.view, nv.name, "[num_pages, page_size, H_kv]",
                                         {{num_pages, "num_pages of k_cache"},
                                          {page_size, "page_size of k_cache"},
                                          {h_kv, "H_kv of k_cache"}}));
    }
  } else {
    for (const NamedView& nv : {NamedView{&cache.k_scale_cache, "cache.k_scale_cache"},
                                NamedView{&cache.v_scale_cache, "cache.v_scale_cache"}}) {
      if (!nv.view->empty()) {
        return make_error(ErrorCode::kInvalidArgument, nv.name,
                          ": given, but cache.scale_granularity is per_tensor");
      }
    }
  }

  if (kc.data == cache.v_cache.data && validation::reachable_bytes(kc) > 0) {
    return make_error(ErrorCode::kAliasing,
                      "cache.v_cache: the same memory as cache.k_cache (V would overwrite K)");
  }
  // K and V of a combined [P, 2, ...] cache interleave by design, so they are not checked
  // against each other beyond the pointer above.
  const NamedView inputs[] = {{&append_k, "append_k"},
                              {&append_v, "append_v"},
                              {&batch_indices, "batch_indices"},
                              {&positions, "positions"},
                              {&cache.kv_indptr, "cache.kv_indptr"},
                              {&cache.kv_indices, "cache.kv_indices"},
                              {&cache.kv_last_page_len, "cache.kv_last_page_len"}};
  const NamedView outputs[] = {{&cache.k_cache, "cache.k_cache"},
                               {&cache.v_cache, "cache.v_cache"},
                               {&cache.k_scale_cache, "cache.k_scale_cache"},
                               {&cache.v_scale_cache, "cache.v_scale_cache"}};
  for (const NamedView& out : outputs) {
    if (out.view->empty()) continue;
    KVATTN_RETURN_IF_ERROR(check_output_layout(*out.view, out.name));
    for (const NamedView& in : inputs) {
      KVATTN_RETURN_IF_ERROR(check_no_overlap(*out.view, out.name, *in.view, in.name));
    }
  }
  if (per_token) {
    for (int o = 2; o < 4; ++o) {
      for (int other = 0; other < o; ++other) {
        KVATTN_RETURN_IF_ERROR(check_no_overlap(*outputs[o].view, outputs[o].name,
                                                *outputs[other].view, outputs[other].name));
      }
    }
  }
  return Status::Ok();
}

namespace {

// rotary_dim, llama31 and the cos/sin cache of RopeParams, against the head dim of q / k.
Status check_rope_dims(const RopeParams& rope, int64_t head_dim, const TensorView& head,
                       std::string_view head_name) {
  if (rope.llama31) {
    const Llama31Scaling& l = *rope.llama31;
    KVATTN_RETURN_IF_ERROR(check_positive_scale("rope.llama31.low_freq_factor", l.low_freq_factor));
    KVATTN_RETURN_IF_ERROR(
        check_positive_scale("rope.llama31.high_freq_factor", l.high_freq_factor));
    KVATTN_RETURN_IF_ERROR(check_positive_scale("rope.llama31.old_context_len", l.old_context_len));
    if (!(l.high_freq_factor > l.low_freq_factor)) {
      return make_error(ErrorCode::kInvalidScale,
                        "rope.llama31.high_freq_factor = ", l.high_freq_factor,
                        ": must be > low_freq_factor = ", l.low_freq_factor);
    }
  }
  int64_t rotary_dim = rope.rotary_dim;
  if (!rope.cos_sin_cache.empty()) {
    const TensorView& c = rope.cos_sin_cache;
    KVATTN_RETURN_IF_ERROR(check_view(c, "rope.cos_sin_cache"));
    KVATTN_RETURN_IF_ERROR(check_dtype(c, "rope.cos_sin_cache", DType::kF32));
    KVATTN_RETURN_IF_ERROR(check_same_memory(c, "rope.cos_sin_cache", head, head_name));
    KVATTN_RETURN_IF_ERROR(
        check_shape(c, "rope.cos_sin_cache", "[max_position, rotary_dim]", {{-1, ""}, {-1, ""}}));
    if (rope.rotary_dim != 0 && rope.rotary_dim != c.shape[1]) {
      return make_error(ErrorCode::kInvalidShape, "rope.rotary_dim = ", rope.rotary_dim,
                        ": must be 0 or equal rope.cos_sin_cache.shape[1] = ", c.shape[1]);
    }
    rotary_dim = c.shape[1];
  }
  const std::string_view what =
      rope.cos_sin_cache.empty() ? "rope.rotary_dim" : "rope.cos_sin_cache.shape[1]";
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim ||
      (!rope.cos_sin_cache.empty() && rotary_dim == 0)) {
    return make_error(ErrorCode::kInvalidShape, what, " = ", rotary_dim,
                      ": must be even and in [2, D], D = ", head_dim, " (", head_name, ".shape[2])",
                      rope.cos_sin_cache.empty() ? ", or 0 for D" : "");
  }
  return Status::Ok();
}

}  // namespace

Status validate_apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                           const TensorView& k_out, const TensorView& pos_ids,
                           const RopeParams& rope) {
  constexpr std::string_view op = "apply_rope";
  KVATTN_RETURN_IF_ERROR(check_positive_scale("rope_theta", rope.rope_theta));
  KVATTN_RETURN_IF_ERROR(check_positive_scale("rope_scale", rope.rope_scale));
  // An empty output skips that tensor; its input is then not read.
  const bool do_q = !q_out.empty(), do_k = !k_out.empty();
  const TensorView* first = nullptr;
  const char* first_name = "";
  if (do_q) {
    KVATTN_RETURN_IF_ERROR(check_given(q, "q", "apply_rope with q_out"));
    KVATTN_RETURN_IF_ERROR(check_given(q_out, "q_out", op));
    first = &q;
    first_name = "q";
  }
  if (do_k) {
    KVATTN_RETURN_IF_ERROR(check_given(k, "k", "apply_rope with k_out"));
    KVATTN_RETURN_IF_ERROR(check_given(k_out, "k_out", op));
    if (!first) {
      first = &k;
      first_name = "k";
    }
  }
  KVATTN_RETURN_IF_ERROR(check_given(pos_ids, "pos_ids", op));
  if (!first) return Status::Ok();

  const int64_t nnz = first->rank == 3 ? first->shape[0] : -1;
  const int64_t head_dim = first->rank == 3 ? first->shape[2] : -1;
  const std::string_view nnz_meaning = do_q ? "nnz of q" : "nnz of k";
  const std::string_view dim_meaning = do_q ? "D of q" : "D of k";
  if (do_q) {
    KVATTN_RETURN_IF_ERROR(check_shape(q, "q", "[nnz, H_qo, D]", {{-1, ""}, {-1, ""}, {-1, ""}}));
    KVATTN_RETURN_IF_ERROR(
        check_shape(q_out, "q_out", "[nnz, H_qo, D] (as q)",
                    {{q.shape[0], "nnz of q"}, {q.shape[1], "H_qo of q"}, {q.shape[2], "D of q"}}));
  }
  if (do_k) {
    KVATTN_RETURN_IF_ERROR(check_shape(k, "k", "[nnz, H_kv, D]",
                                       {{nnz, nnz_meaning}, {-1, ""}, {head_dim, dim_meaning}}));
    KVATTN_RETURN_IF_ERROR(
        check_shape(k_out, "k_out", "[nnz, H_kv, D] (as k)",
                    {{k.shape[0], "nnz of k"}, {k.shape[1], "H_kv of k"}, {k.shape[2], "D of k"}}));
  }
  if (head_dim < 1 || head_dim % 2 != 0) {
    return make_error(ErrorCode::kInvalidShape, first_name, ".shape[2] = ", head_dim,
                      ": the head dim must be even and >= 2 (RoPE rotates pairs)");
  }
  KVATTN_RETURN_IF_ERROR(check_index_tensor(pos_ids, "pos_ids", op, nnz, nnz_meaning));
  KVATTN_RETURN_IF_ERROR(check_rope_dims(rope, head_dim, *first, first_name));

  const NamedView data[] = {{&q, "q"}, {&k, "k"}, {&q_out, "q_out"}, {&k_out, "k_out"}};
  for (const NamedView& nv : data) {
    const bool used = (nv.view == &q || nv.view == &q_out) ? do_q : do_k;
    if (!used) continue;
    KVATTN_RETURN_IF_ERROR(check_value_dtype(*nv.view, nv.name));
    KVATTN_RETURN_IF_ERROR(check_same_memory(*nv.view, nv.name, *first, first_name));
  }
  for (int64_t i = 0; i < nnz; ++i) {
    const int32_t pos = index_at(pos_ids, i);
    if (pos < 0) {
      return make_error(ErrorCode::kInvalidArgument, "pos_ids[", i, "] = ", pos, ": must be >= 0");
    }
    if (!rope.cos_sin_cache.empty() && pos >= rope.cos_sin_cache.shape[0]) {
      return make_error(ErrorCode::kOutOfBounds, "pos_ids[", i, "] = ", pos,
                        ": must be < rope.cos_sin_cache.shape[0] = ", rope.cos_sin_cache.shape[0],
                        " (the cache's max_position)");
    }
  }

  // In place (the output is exactly its input's view) is allowed; any other overlap is not.
  if (do_q) {
    KVATTN_RETURN_IF_ERROR(check_output_layout(q_out, "q_out"));
    if (!same_view(q_out, q)) KVATTN_RETURN_IF_ERROR(check_no_overlap(q_out, "q_out", q, "q"));
    if (do_k) KVATTN_RETURN_IF_ERROR(check_no_overlap(q_out, "q_out", k, "k"));
    KVATTN_RETURN_IF_ERROR(check_no_overlap(q_out, "q_out", pos_ids, "pos_ids"));
  }
  if (do_k) {
    KVATTN_RETURN_IF_ERROR(check_output_layout(k_out, "k_out"));
    if (!same_view(k_out, k)) KVATTN_RETURN_IF_ERROR(check_no_overlap(k_out, "k_out", k, "k"));
    if (do_q) {
      KVATTN_RETURN_IF_ERROR(check_no_overlap(k_out, "k_out", q, "q"));
      KVATTN_RETURN_IF_ERROR(check_no_overlap(k_out, "k_out", q_out, "q_out"));
    }
    KVATTN_RETURN_IF_ERROR(check_no_overlap(k_out, "k_out", pos_ids, "pos_ids"));
  }
  return Status::Ok();
}

}  // namespace kvattn
