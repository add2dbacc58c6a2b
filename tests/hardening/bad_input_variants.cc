// The bad-input catalogue's cases for issue 11: attention sinks and FP8 K/V scales per head and
// per (token, head) — missing, unasked-for, misshapen, mistyped, aliased and out-of-range values.
#include <string>
#include <utility>
#include <vector>

#include "hardening/bad_input_cases.h"

namespace kvattn::hardening {
namespace {

// Turns a variant on with valid tensors; the cases then break one thing about it.
void with_sinks(F& f) {
  f.problem.use_sinks = true;
  f.sinks.assign(static_cast<std::size_t>(f.problem.num_qo_heads), 0.5f);
  f.args.sinks = f32_view(f.sinks, {f.problem.num_qo_heads});
}
// FP8 K/V (the granularities are for FP8 caches): the views change dtype over the same buffers,
// which the refused calls never read.
void with_fp8(F& f) {
  f.problem.kv_dtype = DType::kE4M3;
  keys(f).dtype = values(f).dtype = DType::kE4M3;
}
void with_head_scales(F& f) {
  with_fp8(f);
  f.problem.kv_scale_granularity = KVScaleGranularity::kPerHead;
  const int64_t hk = f.problem.num_kv_heads;
  f.k_scale.assign(static_cast<std::size_t>(hk), 0.5f);
  f.v_scale.assign(static_cast<std::size_t>(hk), 2.0f);
  f.args.k_scale = f32_view(f.k_scale, {hk});
  f.args.v_scale = f32_view(f.v_scale, {hk});
}
// Scale caches addressed like the slots: [P, page_size, H_kv] paged, [keys, H_kv] otherwise.
void with_token_scales(F& f) {
  with_fp8(f);
  f.problem.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
  const int64_t hk = f.problem.num_kv_heads;
  const bool paged = is_paged(f.problem.op);
  const int64_t rows = paged ? f.num_pages * f.problem.page_size : keys(f).shape[0];
  for (auto* cache : {&f.k_scale_cache, &f.v_scale_cache}) {
    cache->assign(static_cast<std::size_t>(rows * hk), 0.25f);
  }
  if (paged) {
    const int64_t ps = f.problem.page_size;
    f.args.k_scale_cache = f32_view(f.k_scale_cache, {f.num_pages, ps, hk});
    f.args.v_scale_cache = f32_view(f.v_scale_cache, {f.num_pages, ps, hk});
  } else {
    f.args.k_scale_cache = f32_view(f.k_scale_cache, {rows, hk});
    f.args.v_scale_cache = f32_view(f.v_scale_cache, {rows, hk});
  }
}
// The slot of a key every request reads: key 0 of the first request with keys.
std::size_t first_read_slot(F& f) {
  if (!is_paged(f.problem.op)) return 0;
  const int64_t page = f.kv_indices[static_cast<std::size_t>(f.kv_indptr[0])];
  return static_cast<std::size_t>(page * f.problem.page_size * f.problem.num_kv_heads);
}

}  // namespace

std::vector<AttentionCase> variant_cases() {
  const bool kProblem = false;
  std::vector<AttentionCase> cases = {
      // (use_sinks says a layer may pass sinks: one without them is valid.) Sinks given to a
      // problem without use_sinks: plan refuses them; a plan's run takes them where its backend
      // has sinks (tests/core/run_values_test.cc).
      {"sinks_without_use_sinks", kAll,
       [](F& f) {
         with_sinks(f);
         f.problem.use_sinks = false;
       },
       ErrorCode::kInvalidArgument, kProblem},
      {"sinks_wrong_length", kAll,
       [](F& f) {
         with_sinks(f);
         f.args.sinks.shape[0] -= 1;
       },
       ErrorCode::kInvalidShape, kProblem},
      {"sinks_dtype_bf16", kAll,
       [](F& f) {
         with_sinks(f);
         f.args.sinks.dtype = DType::kBF16;
       },
       ErrorCode::kInvalidDType, kProblem},
      {"sinks_nan", kAll,
       [](F& f) {
         with_sinks(f);
         f.sinks[1] = kNaN;
       },
       ErrorCode::kInvalidArgument, kProblem},
      {"sinks_inf", kAll,
       [](F& f) {
         with_sinks(f);
         f.sinks[0] = -kInf;
       },
       ErrorCode::kInvalidArgument, kProblem},
      {"sinks_overlap_out", kAll,
       [](F& f) {
         with_sinks(f);
         f.args.sinks = f32_view(f.out, {f.problem.num_qo_heads});
       },
       ErrorCode::kAliasing, kProblem},
      {"scale_granularity_on_bf16_kv", kAll,
       [](F& f) { f.problem.kv_scale_granularity = KVScaleGranularity::kPerHead; },
       ErrorCode::kInvalidArgument, kProblem},
      {"scale_granularity_code_out_of_range", kAll,
       [](F& f) { f.problem.kv_scale_granularity = static_cast<KVScaleGranularity>(7); },
       ErrorCode::kInvalidArgument, kProblem},
      {"per_head_with_per_tensor_k_scale", kAll,
       [](F& f) {
         with_head_scales(f);
         f.args.scalars.k_scale = 2.0f;
       },
       ErrorCode::kInvalidScale, kProblem},
      {"per_head_k_scale_missing", kAll,
       [](F& f) {
         with_head_scales(f);
         f.args.k_scale = TensorView{};
       },
       ErrorCode::kInvalidArgument, kProblem, MaskMode::kNone, false,
       /*plan_needs_no_data=*/true},
      {"per_head_v_scale_wrong_length", kAll,
       [](F& f) {
         with_head_scales(f);
         f.args.v_scale.shape[0] = f.problem.num_qo_heads;
       },
       ErrorCode::kOutOfBounds, kProblem},
      {"per_head_k_scale_rank_2", kAll,
       [](F& f) {
         with_head_scales(f);
         add_unit_dim(&f.args.k_scale);
       },
       ErrorCode::kInvalidShape, kProblem},
      {"per_head_tensors_with_per_tensor", kAll,
       [](F& f) {
         with_head_scales(f);
         f.problem.kv_scale_granularity = KVScaleGranularity::kPerTensor;
       },
       ErrorCode::kInvalidArgument, kProblem},
      {"per_token_cache_given_with_per_head", kAll,
       [](F& f) {
         with_token_scales(f);
         with_head_scales(f);
       },
       ErrorCode::kInvalidArgument, kProblem},
      {"per_token_scale_dtype_f16", kAll,
       [](F& f) {
         with_token_scales(f);
         f.args.v_scale_cache.dtype = DType::kF16;
       },
       ErrorCode::kInvalidDType, kProblem},
      {"per_token_scale_cache_short", kAll,
       [](F& f) {
         with_token_scales(f);
         f.args.k_scale_cache.shape[0] -= 1;
       },
       ErrorCode::kInvalidShape, kProblem},
      {"per_token_scale_cache_wrong_heads", kAll,
       [](F& f) {
         with_token_scales(f);
         f.args.v_scale_cache.shape[f.args.v_scale_cache.rank - 1] = 1;
       },
       ErrorCode::kInvalidShape, kProblem},
  };
  for (auto [name, value] : {std::pair{"zero", 0.0f}, std::pair{"negative", -1.0f},
                             std::pair{"nan", kNaN}, std::pair{"inf", kInf}}) {
    const float x = value;
    cases.push_back({std::string("per_head_k_scale_") + name, kAll,
                     [x](F& f) {
                       with_head_scales(f);
                       f.k_scale[1] = x;
                     },
                     ErrorCode::kInvalidScale, kProblem});
    cases.push_back({std::string("per_head_v_scale_") + name, kAll,
                     [x](F& f) {
                       with_head_scales(f);
                       f.v_scale[0] = x;
                     },
                     ErrorCode::kInvalidScale, kProblem});
    cases.push_back({std::string("per_token_k_scale_") + name, kAll,
                     [x](F& f) {
                       with_token_scales(f);
                       f.k_scale_cache[first_read_slot(f) + 1] = x;
                     },
                     ErrorCode::kInvalidScale, kProblem, MaskMode::kNone, false,
                     /*plan_needs_no_data=*/true});
    cases.push_back({std::string("per_token_v_scale_") + name, kAll,
                     [x](F& f) {
                       with_token_scales(f);
                       f.v_scale_cache[first_read_slot(f)] = x;
                     },
                     ErrorCode::kInvalidScale, kProblem, MaskMode::kNone, false,
                     /*plan_needs_no_data=*/true});
  }
  return cases;
}

}  // namespace kvattn::hardening
