#include "testing/variants.h"

namespace kvattn::testing {
namespace {

bool fp8_cache(const Problem& p) { return is_fp8(p.kv_dtype); }

const AttentionVariant kVariants[] = {
    {"plain", [](CaseSpec&) {}},
    {"causal", [](CaseSpec& s) { s.problem.mask_mode = MaskMode::kCausal; }},
    {"causal_window",
     [](CaseSpec& s) {
       s.problem.mask_mode = MaskMode::kCausal;
       s.problem.window_left = 9;
     }},
    {"window_only", [](CaseSpec& s) { s.problem.window_left = 20; }},
    {"soft_cap",
     [](CaseSpec& s) {
       s.problem.logits_soft_cap = 0.5f;
       s.value_range = 2.0f;
     }},
    {"custom_mask", [](CaseSpec& s) { s.problem.mask_mode = MaskMode::kCustom; }},
    {"custom_mask_packed",
     [](CaseSpec& s) {
       s.problem.mask_mode = MaskMode::kCustom;
       s.packed_custom_mask = true;
     }},
    {"alibi", [](CaseSpec& s) { s.problem.pos_encoding_mode = PosEncoding::kAlibi; }},
    {"rope", [](CaseSpec& s) { s.problem.pos_encoding_mode = PosEncoding::kRopeLlama; }},
    {"rope_interleaved_scaled",
     [](CaseSpec& s) {
       s.problem.pos_encoding_mode = PosEncoding::kRopeLlama;
       s.problem.rope_interleave = true;
       s.problem.rope_theta = 5e5f;
       s.problem.rope_scale = 4.0f;
     }},
    {"lse", [](CaseSpec& s) { s.return_lse = true; }},
    {"fp16_qk_reduction",
     [](CaseSpec& s) {
       s.problem.use_fp16_qk_reduction = true;
       s.return_lse = true;
     }},
    {"sm_scale", [](CaseSpec& s) { s.problem.sm_scale = 0.3f; }},
    {"sinks",
     [](CaseSpec& s) {
       s.problem.use_sinks = true;
       s.return_lse = true;
     }},
    // The scale tensors replace the per-tensor floats, which must then stay 1.
    {"per_head_scales",
     [](CaseSpec& s) {
       s.problem.kv_scale_granularity = KVScaleGranularity::kPerHead;
       s.scalars.k_scale = s.scalars.v_scale = 1.0f;
     },
     fp8_cache},
    {"per_token_head_scales",
     [](CaseSpec& s) {
       s.problem.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
       s.scalars.k_scale = s.scalars.v_scale = 1.0f;
     },
     fp8_cache},
    {"everything",
     [](CaseSpec& s) {
       s.problem.mask_mode = MaskMode::kCausal;
       s.problem.window_left = 30;
       s.problem.logits_soft_cap = 2.0f;
       s.problem.pos_encoding_mode = PosEncoding::kAlibi;
       s.return_lse = true;
     }},
};

}  // namespace

std::span<const AttentionVariant> attention_variants() { return kVariants; }

}  // namespace kvattn::testing
