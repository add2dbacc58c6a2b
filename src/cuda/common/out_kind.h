// The output element types fa2's and fa3's epilogues write (host and device code alike).
#pragma once

#include <cstdint>

#include "kvattn/dtype.h"

namespace kvattn::cuda {

enum class OutKind : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// The o dtype's kind (validated args: f32, f16 or bf16).
inline OutKind out_kind(DType d) {
  return d == DType::kF32 ? OutKind::kF32 : d == DType::kF16 ? OutKind::kF16 : OutKind::kBF16;
}

}  // namespace kvattn::cuda
