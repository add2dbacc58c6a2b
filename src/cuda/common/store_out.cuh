// One output element in the output's type (f32, f16 or bf16): fa2's and fa3's epilogues and
// split-KV merges alike. Params: any kernel parameter block with `void* out` and
// `cuda::OutKind out_kind`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/out_kind.h"

namespace kvattn::cuda {

template <class Params>
__device__ __forceinline__ void store_out(const Params& p, int64_t offset, float x) {
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

}  // namespace kvattn::cuda
