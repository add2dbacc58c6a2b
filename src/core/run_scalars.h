// What the backends share about a layer's run values (AttentionArgs::scalars).
#pragma once

#include "core/math_constants.h"
#include "kvattn/attention.h"

namespace kvattn {

// The factor each kernel's epilogue multiplies the natural LSE by where it stores the final LSE
// (split-KV partial states stay natural): log2 e for LseBase::k2. -inf and NaN stay as they are.
inline float lse_store_scale(const RunScalars& s) {
  return s.lse_base == LseBase::k2 ? math::kLog2e : 1.0f;
}

}  // namespace kvattn
