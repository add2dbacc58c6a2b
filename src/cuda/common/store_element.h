// One output element in the output's type (f32, f16 or bf16), host and device: the one store of
// fa2's and fa3's epilogues (store_out.cuh), the split-KV merge (split_merge.h) and the CPU
// replays. On the device through CUDA's round-to-nearest conversions, on the host through
// core/numeric.h's (the same rounding).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/numeric.h"
#include "cuda/common/out_kind.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kvattn::cuda {

KVATTN_HD void store_element(void* out, OutKind kind, int64_t offset, float x) {
  switch (kind) {
    case OutKind::kF32:
      static_cast<float*>(out)[offset] = x;
      break;
#if defined(__CUDA_ARCH__)
    case OutKind::kF16:
      static_cast<__half*>(out)[offset] = __float2half_rn(x);
      break;
    case OutKind::kBF16:
      static_cast<__nv_bfloat16*>(out)[offset] = __float2bfloat16_rn(x);
      break;
#else
    case OutKind::kF16:
      static_cast<uint16_t*>(out)[offset] = num::f32_to_f16(x);
      break;
    case OutKind::kBF16:
      static_cast<uint16_t*>(out)[offset] = num::f32_to_bf16(x);
      break;
#endif
  }
}

}  // namespace kvattn::cuda
