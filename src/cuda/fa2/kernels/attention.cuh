// fa2's attention kernel: the __global__ entry over the host/device CTA body of attention_cta.h
// (which documents the tiles and the pipeline), run with the device's operations (cta_ops.h).
#pragma once

#include <cuda_runtime.h>

#include "cuda/fa2/kernels/attention_cta.h"
#include "cuda/fa2/kernels/cta_ops.h"
#include "cuda/fa2/params.h"

namespace kvattn::fa2 {

template <class C>
__global__ void __launch_bounds__(C::kThreads) attention_kernel(const AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  attention_cta<C>(DeviceOps{}, p, smem, int(blockIdx.x));
}

// What the host needs to launch configuration C: launch.cu sets the shared-memory attribute at
// plan time and launches through fa2's RuntimeCalls at run time (runtime_calls.h).
template <class C>
KernelLaunchInfo kernel_info() {
  return KernelLaunchInfo{reinterpret_cast<const void*>(&attention_kernel<C>), C::kThreads,
                          C::kSmemBytes};
}

// The entry point each generated translation unit instantiates: the decode or the prefill tile
// (params.h), with or without the custom mask compiled in.
template <class QFmt, class KV, int kDqk, int kDvo>
KernelLaunchInfo attention_kernel_info(bool decode_tile, bool custom_mask) {
  if (decode_tile) {
    return custom_mask ? kernel_info<AttentionConfig<QFmt, KV, kDqk, kDvo, true, true>>()
                       : kernel_info<AttentionConfig<QFmt, KV, kDqk, kDvo, true, false>>();
  }
  return custom_mask ? kernel_info<AttentionConfig<QFmt, KV, kDqk, kDvo, false, true>>()
                     : kernel_info<AttentionConfig<QFmt, KV, kDqk, kDvo, false, false>>();
}

}  // namespace kvattn::fa2
