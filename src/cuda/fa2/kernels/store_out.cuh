// Writing one output element in the o dtype the plan chose (f32, f16 or bf16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/fa2/params.h"

namespace kvattn::fa2 {

__device__ __forceinline__ void store_out(const AttentionParams& p, int64_t offset, float x) {
  switch (p.out_kind) {
    case OutKind::kF32:
      static_cast<float*>(p.out)[offset] = x;
      break;
    case OutKind::kF16:
      static_cast<__half*>(p.out)[offset] = __float2half_rn(x);
      break;
    case OutKind::kBF16:
      static_cast<__nv_bfloat16*>(p.out)[offset] = __float2bfloat16_rn(x);
      break;
  }
}

}  // namespace kvattn::fa2
