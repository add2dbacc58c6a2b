// The full-warp shuffles of the CUDA backends' DeviceOps (fa2's cta_ops.h, fa3's device_ops.cuh),
// written once: host/device so that the kernel bodies, which are host/device templates, compile
// for both sides of nvcc; only the device side ever runs (the host side returns its input).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/hd.h"

namespace kvattn::cuda {

struct WarpShuffles {
  KVATTN_HD float shfl_xor(float v, int lane_mask) const {
#if defined(__CUDA_ARCH__)
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#else
    return v + float(lane_mask) * 0.0f;
#endif
  }
  KVATTN_HD float shfl(float v, int src_lane) const {
#if defined(__CUDA_ARCH__)
    return __shfl_sync(0xffffffffu, v, src_lane);
#else
    return v + float(src_lane) * 0.0f;
#endif
  }
  KVATTN_HD uint32_t shfl_u32(uint32_t v, int src_lane) const {
#if defined(__CUDA_ARCH__)
    return __shfl_sync(0xffffffffu, v, src_lane);
#else
    return v + uint32_t(src_lane) * 0u;
#endif
  }
};

}  // namespace kvattn::cuda
