// fa2's capability, declared once. can_implement reads it and the kernel table is instantiated
// from the same arrays (src/cuda/fa2/kernel_table.*), so the two cannot drift.
#pragma once

#include <array>

#include "core/capability.h"

namespace kvattn::fa2 {

inline constexpr int kMinSm = 80;
inline constexpr std::array kOps = {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode,
                                    Op::kBatchPrefillPaged, Op::kBatchPrefillRagged};
inline constexpr std::array kQDTypes = {DType::kF16, DType::kBF16};
// FP8 (and the other 16-bit type) is converted to q's type before the 16-bit MMA.
inline constexpr std::array kKVDTypes = {DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2};
inline constexpr std::array kODTypes = {DType::kF16, DType::kBF16, DType::kF32};
inline constexpr std::array kHeadDims = {HeadDimPair{64, 64},   HeadDimPair{128, 128},
                                         HeadDimPair{256, 256}, HeadDimPair{192, 128},
                                         HeadDimPair{96, 96},   HeadDimPair{512, 512}};
inline constexpr std::array kMaskModes = {MaskMode::kNone, MaskMode::kCausal, MaskMode::kCustom};
inline constexpr std::array kPosEncodings = {PosEncoding::kNone, PosEncoding::kRopeLlama,
                                             PosEncoding::kAlibi};
inline constexpr std::array kKVLayouts = {KVLayout::kNHD, KVLayout::kHND};
// Applied when a K/V block is decoded into the 16-bit tiles (per head, per (token, head)).
inline constexpr std::array kScaleGranularities = {KVScaleGranularity::kPerTensor,
                                                   KVScaleGranularity::kPerHead,
                                                   KVScaleGranularity::kPerTokenHead};

// MLA's paged latent caches need their own kernel (heads as the rows of one GEMM per latent tile);
// until it exists, MLA runs on the CPU backends.
inline constexpr const char* kNoMla =
    "no MLA kernel yet: batch_mla_paged runs on the cpu and reference backends";

inline const CapabilityDecl& capability() {
  static const CapabilityDecl decl{
      .backend = "fa2",
      .device_kind = Device::Kind::kCuda,
      .min_sm = kMinSm,
      .max_sm = 0,
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
      // Declared unsupported (issue 13): the kernel accumulates q.k in f32 MMAs; accepting the
      // flag and computing something else would be a silently ignored flag.
      .fp16_qk_reduction = false,
      .sinks = true,
      .kv_scale_granularities = kScaleGranularities,
      .rules = {},
      .mla_unsupported_reason = kNoMla,
  };
  return decl;
}

}  // namespace kvattn::fa2
