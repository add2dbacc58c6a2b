// fa3's capability, declared once (DESIGN.md §3). A constraint is lifted only by the kernel that
// removes it, in the same change as its tests.
#pragma once

#include <array>

#include "core/capability.h"
#include "core/status_macros.h"

namespace kvattn::fa3 {

inline constexpr int kSm = 90;  // wgmma and TMA as used here exist on SM90a only
inline constexpr std::array kOps = {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode,
                                    Op::kBatchPrefillPaged, Op::kBatchPrefillRagged};
inline constexpr std::array kQDTypes = {DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2};
inline constexpr std::array kKVDTypes = {DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2};
inline constexpr std::array kODTypes = {DType::kF16, DType::kBF16, DType::kF32};
inline constexpr std::array kHeadDims = {HeadDimPair{64, 64}, HeadDimPair{128, 128},
                                         HeadDimPair{256, 256}, HeadDimPair{192, 128}};
inline constexpr std::array kMaskModes = {MaskMode::kNone, MaskMode::kCausal};
inline constexpr std::array kPosEncodings = {PosEncoding::kNone};
inline constexpr std::array kKVLayouts = {KVLayout::kNHD, KVLayout::kHND};

// wgmma reads Q and K in one type: an FP8 cache needs an FP8 query (BF16/FP16 Q with FP8 KV runs
// on fa2 — the case this project was founded on), and an FP8 query needs an FP8 cache.
inline Status fp8_kv_needs_fp8_q(const Problem& p, const Device&) {
  if (is_fp8(p.kv_dtype) && !is_fp8(p.q_dtype)) {
    return make_error(ErrorCode::kNotSupported, "fa3: FP8 KV (kv dtype ", dtype_name(p.kv_dtype),
                      ") needs an FP8 query, q dtype is ", dtype_name(p.q_dtype),
                      " (fa2 runs 16-bit Q over an FP8 KV cache)");
  }
  if (is_fp8(p.q_dtype) && !is_fp8(p.kv_dtype)) {
    return make_error(ErrorCode::kNotSupported, "fa3: an FP8 query (q dtype ",
                      dtype_name(p.q_dtype), ") needs an FP8 KV cache, kv dtype is ",
                      dtype_name(p.kv_dtype));
  }
  return Status::Ok();
}

inline Status same_16bit_type(const Problem& p, const Device&) {
  if (is_16bit_float(p.q_dtype) && is_16bit_float(p.kv_dtype) && p.q_dtype != p.kv_dtype) {
    return make_error(ErrorCode::kNotSupported, "fa3: kv dtype ", dtype_name(p.kv_dtype),
                      " must equal q dtype ", dtype_name(p.q_dtype),
                      " (wgmma takes one 16-bit type for Q and K)");
  }
  return Status::Ok();
}

inline Status no_soft_cap_with_fp8(const Problem& p, const Device&) {
  if (p.logits_soft_cap > 0 && (is_fp8(p.q_dtype) || is_fp8(p.kv_dtype))) {
    return make_error(ErrorCode::kNotSupported, "fa3: logits_soft_cap ", p.logits_soft_cap,
                      " is not supported with FP8 (q ", dtype_name(p.q_dtype), ", kv ",
                      dtype_name(p.kv_dtype), ")");
  }
  return Status::Ok();
}

inline constexpr std::array<CapabilityRule, 3> kRules = {fp8_kv_needs_fp8_q, same_16bit_type,
                                                         no_soft_cap_with_fp8};

// MLA's paged latent caches need their own kernel (heads as the rows of one GEMM per latent tile);
// until it exists, MLA runs on the CPU backends.
inline constexpr const char* kNoMla =
    "no MLA kernel yet: batch_mla_paged runs on the cpu and reference backends";

inline const CapabilityDecl& capability() {
  static const CapabilityDecl decl{
      .backend = "fa3",
      .device_kind = Device::Kind::kCuda,
      .min_sm = kSm,
      .max_sm = kSm,
      .ops = kOps,
      .q_dtypes = kQDTypes,
      .kv_dtypes = kKVDTypes,
      .o_dtypes = kODTypes,
      .head_dims = kHeadDims,
      .mask_modes = kMaskModes,
      .pos_encodings = kPosEncodings,
      .kv_layouts = kKVLayouts,
      .soft_cap = true,
      .sliding_window = true,
      .fp16_qk_reduction = false,
      // No attention sinks and per-tensor FP8 scales only, until fa3's kernels have them.
      .sinks = false,
      .kv_scale_granularities = {},
      .rules = kRules,
      .mla_unsupported_reason = kNoMla,
  };
  return decl;
}

}  // namespace kvattn::fa3
