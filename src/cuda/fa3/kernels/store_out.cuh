// One output element in the output's type (f32, f16 or bf16), for fa3's attention epilogue and its
// split-KV merge alike.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

__device__ __forceinline__ void store_out(const PrefillParams& p, int64_t offset, float x) {
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

}  // namespace kvattn::fa3
