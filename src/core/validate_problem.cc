#include <cmath>

#include "core/status_macros.h"
#include "core/validate.h"

namespace kvattn {
namespace {

// Head dims past this are refused by every backend: no model uses them, and it keeps every
// per-row buffer small and every offset far from overflow.
constexpr int kMaxHeadDim = 1024;
constexpr int kMaxHeads = 4096;
constexpr int kMaxPageSize = 1 << 16;

// is_float() alone would take an out-of-range dtype code for a float.
bool is_float_dtype(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kE4M3 ||
         d == DType::kE5M2;
}

Status check_scale(const char* name, float value) {
  if (!std::isfinite(value) || value <= 0.0f) {
    return make_error(ErrorCode::kInvalidScale, name, " = ", value,
                      ": must be finite and positive");
  }
  return Status::Ok();
}

}  // namespace

Status validate_problem(const Problem& p) {
  // Enumerations arrive as plain integers from case files, the command line and bindings.
  if (static_cast<unsigned>(p.op) > static_cast<unsigned>(Op::kBatchMLAPaged)) {
    return make_error(ErrorCode::kInvalidArgument, "op code ", static_cast<int>(p.op),
                      ": not an operation");
  }
  if (p.kv_layout != KVLayout::kNHD && p.kv_layout != KVLayout::kHND) {
    return make_error(ErrorCode::kInvalidArgument, "kv_layout code ", static_cast<int>(p.kv_layout),
                      ": must be NHD or HND");
  }
  if (static_cast<unsigned>(p.mask_mode) > static_cast<unsigned>(MaskMode::kCustom)) {
    return make_error(ErrorCode::kInvalidArgument, "mask_mode code ", static_cast<int>(p.mask_mode),
                      ": must be none, causal or custom");
  }
  if (static_cast<unsigned>(p.pos_encoding_mode) > static_cast<unsigned>(PosEncoding::kAlibi)) {
    return make_error(ErrorCode::kInvalidArgument, "pos_encoding_mode code ",
                      static_cast<int>(p.pos_encoding_mode), ": must be NONE, ROPE_LLAMA or ALIBI");
  }
  if (static_cast<unsigned>(p.kv_scale_granularity) >
      static_cast<unsigned>(KVScaleGranularity::kPerTokenHead)) {
    return make_error(ErrorCode::kInvalidArgument, "kv_scale_granularity code ",
                      static_cast<int>(p.kv_scale_granularity),
                      ": must be per_tensor, per_head or per_token_head");
  }
  if (p.num_qo_heads <= 0 || p.num_qo_heads > kMaxHeads) {
    return make_error(ErrorCode::kInvalidShape, "num_qo_heads = ", p.num_qo_heads,
                      ": must be in [1, ", kMaxHeads, "]");
  }
  if (p.num_kv_heads <= 0 || p.num_kv_heads > kMaxHeads) {
    return make_error(ErrorCode::kInvalidShape, "num_kv_heads = ", p.num_kv_heads,
                      ": must be in [1, ", kMaxHeads, "]");
  }
  if (p.num_qo_heads % p.num_kv_heads != 0) {
    return make_error(ErrorCode::kInvalidShape, "num_qo_heads = ", p.num_qo_heads,
                      ": must be a multiple of num_kv_heads = ", p.num_kv_heads);
  }
  if (p.head_dim_qk <= 0 || p.head_dim_qk > kMaxHeadDim) {
    return make_error(ErrorCode::kInvalidShape, "head_dim_qk = ", p.head_dim_qk,
                      ": must be in [1, ", kMaxHeadDim, "]");
  }
  if (p.head_dim_vo <= 0 || p.head_dim_vo > kMaxHeadDim) {
    return make_error(ErrorCode::kInvalidShape, "head_dim_vo = ", p.head_dim_vo,
                      ": must be in [1, ", kMaxHeadDim, "]");
  }
  if (is_batch(p.op) && p.batch_size < 1) {
    return make_error(ErrorCode::kInvalidShape, "batch_size = ", p.batch_size,
                      p.batch_size == 0 ? ": an empty batch; batch operations need >= 1 request"
                                        : ": must be >= 1");
  }
  if (!is_batch(p.op) && p.batch_size != 1) {
    return make_error(ErrorCode::kInvalidShape, "batch_size = ", p.batch_size,
                      ": must be 1 for single operations");
  }
  if (is_paged(p.op) && (p.page_size <= 0 || p.page_size > kMaxPageSize)) {
    return make_error(ErrorCode::kInvalidShape, "page_size = ", p.page_size, ": must be in [1, ",
                      kMaxPageSize, "]");
  }
  if (!is_float_dtype(p.q_dtype)) {
    return make_error(ErrorCode::kInvalidDType, "q dtype ", dtype_name(p.q_dtype),
                      ": must be a floating-point type");
  }
  if (!is_float_dtype(p.kv_dtype)) {
    return make_error(ErrorCode::kInvalidDType, "kv dtype ", dtype_name(p.kv_dtype),
                      ": must be a floating-point type");
  }
  if (!is_float_dtype(p.o_dtype) || is_fp8(p.o_dtype)) {
    return make_error(ErrorCode::kInvalidDType, "o dtype ", dtype_name(p.o_dtype),
                      ": must be f32, f16 or bf16");
  }
  if (std::isnan(p.logits_soft_cap) || std::isinf(p.logits_soft_cap) || p.logits_soft_cap < 0) {
    return make_error(ErrorCode::kInvalidArgument, "logits_soft_cap = ", p.logits_soft_cap,
                      ": must be finite and >= 0 (0 disables it)");
  }
  if (p.sm_scale) KVATTN_RETURN_IF_ERROR(check_scale("sm_scale", *p.sm_scale));
  if (p.kv_scale_granularity != KVScaleGranularity::kPerTensor && !is_fp8(p.kv_dtype)) {
    return make_error(ErrorCode::kInvalidArgument, "kv_scale_granularity ",
                      kv_scale_granularity_name(p.kv_scale_granularity), ": kv dtype is ",
                      dtype_name(p.kv_dtype), " (scale granularity is for FP8 KV: e4m3, e5m2)");
  }
  if (is_mla(p.op)) KVATTN_RETURN_IF_ERROR(validate_mla_problem(p));
  if (p.pos_encoding_mode == PosEncoding::kRopeLlama) {
    KVATTN_RETURN_IF_ERROR(check_scale("rope_theta", p.rope_theta));
    KVATTN_RETURN_IF_ERROR(check_scale("rope_scale", p.rope_scale));
    if (p.head_dim_qk % 2 != 0) {
      return make_error(ErrorCode::kInvalidShape, "head_dim_qk = ", p.head_dim_qk,
                        ": must be even for pos_encoding_mode ROPE_LLAMA");
    }
  }
  return Status::Ok();
}

}  // namespace kvattn
