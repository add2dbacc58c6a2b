// One output element in the output's type, in a kernel parameter block (`void* out`,
// `cuda::OutKind out_kind`): store_element (store_element.h) for fa2's and fa3's epilogues.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/out_kind.h"
#include "cuda/common/store_element.h"

namespace kvattn::cuda {

template <class Params>
__device__ __forceinline__ void store_out(const Params& p, int64_t offset, float x) {
  store_element(p.out, p.out_kind, offset, x);
}

}  // namespace kvattn::cuda
