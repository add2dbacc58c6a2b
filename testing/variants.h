// The attention variants every backend is checked on against the reference: one list, used by
// the cpu tests and the GPU tests alike, so that a variant added for one backend is tried on all.
#pragma once

#include <span>

#include "kvattn/problem.h"
#include "testing/case_builder.h"

namespace kvattn::testing {

struct AttentionVariant {
  const char* name;
  // Turns the variant on in a case (made for any operation, with any dtypes).
  void (*apply)(CaseSpec& spec);
  // Whether the variant means anything for this problem (e.g. FP8 scale granularities need an
  // FP8 cache); null: always. A test skips the pairs where it does not, never counts them.
  bool (*applies)(const Problem& problem) = nullptr;
};

// plain, causal, windows, soft cap, custom masks (bytes and packed bits), ALiBi, RoPE (plain and
// interleaved with theta/scale), LSE, fp16 QK reduction, sm_scale, sinks, per-head and
// per-(token, head) FP8 scales, and everything at once.
std::span<const AttentionVariant> attention_variants();

inline bool variant_applies(const AttentionVariant& v, const Problem& p) {
  return v.applies == nullptr || v.applies(p);
}

}  // namespace kvattn::testing
