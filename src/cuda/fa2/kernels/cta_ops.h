// The thread-level operations fa2's kernel body (attention_cta.h) is written over, so that the
// same body runs on the GPU (DeviceOps: the PTX instructions) and on the CPU (tests/cuda/
// cta_emulator.h: one std::thread per CUDA thread, the warp collectives emulated from the PTX
// ISA's definitions). An Ops is a per-thread handle; every call below is made by the calling
// thread, and the warp collectives (shfl*, ldmatrix*, mma) must be reached by all 32 lanes of
// the warp with the same operation (the emulator checks this).
//
//   int  thread() const                 this thread's index in the CTA (threadIdx.x)
//   void sync() const                   CTA barrier (__syncthreads), shared memory ordered
//   bool sync_or(bool) const            CTA barrier returning whether any thread passed true
//   float shfl_xor(float, int mask)     __shfl_xor_sync over the full warp
//   float shfl(float, int src_lane)     __shfl_sync over the full warp
//   void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row)        ldmatrix.x4 (shared memory)
//   void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row)  ldmatrix.x4.trans
//   template <class F> void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
//                                       mma.m16n8k16.row.col, f32 += F x F (formats.h)
//   void cp_async_16(void* smem, const void* gmem, bool valid)
//                                       16 bytes global -> shared, asynchronous; !valid: the 16
//                                       bytes are zero-filled and gmem is not read
//   void cp_async_commit() const        closes this thread's current group of copies
//   template <int N> void cp_async_wait() const
//                                       all but this thread's newest N groups have landed
//   template <class T> T ldg(const T*)  read-only global load
#pragma once

#include <cstdint>

#include "core/hd.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_shuffles.cuh"
#endif

namespace kvattn::fa2 {

#if defined(__CUDACC__)
// The device's operations (the SM80 instructions through cuda/common/ptx.cuh's wrappers). Its
// methods are host-device so that the host-device body compiles for both sides; only the device
// side is ever run (the host side traps). The shuffles are the shared cuda::WarpShuffles.
struct DeviceOps : cuda::WarpShuffles {
  KVATTN_HD int thread() const {
#if defined(__CUDA_ARCH__)
    return int(threadIdx.x);
#else
    return 0;
#endif
  }
  KVATTN_HD void sync() const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  KVATTN_HD bool sync_or(bool pred) const {
#if defined(__CUDA_ARCH__)
    return __syncthreads_or(pred) != 0;
#else
    return pred;
#endif
  }
  KVATTN_HD void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) const {
#if defined(__CUDA_ARCH__)
    cuda::ldmatrix_x4(r, row);
#else
    r[0] = r[1] = r[2] = r[3] = row ? 0u : 0u;
#endif
  }
  KVATTN_HD void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) const {
#if defined(__CUDA_ARCH__)
    cuda::ldmatrix_x4_trans(r, row);
#else
    r[0] = r[1] = r[2] = r[3] = row ? 0u : 0u;
#endif
  }
  template <class F>
  KVATTN_HD void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) const {
#if defined(__CUDA_ARCH__)
    if constexpr (F::kF16) {
      cuda::mma_16816<cuda::F16Tag>(d, a, b0, b1);
    } else {
      cuda::mma_16816<cuda::Bf16Tag>(d, a, b0, b1);
    }
#else
    (void)d, (void)a, (void)b0, (void)b1;
#endif
  }
  KVATTN_HD void cp_async_16(void* smem, const void* gmem, bool valid) const {
#if defined(__CUDA_ARCH__)
    cuda::cp_async_16_zfill(smem, gmem, valid);
#else
    (void)smem, (void)gmem, (void)valid;
#endif
  }
  KVATTN_HD void cp_async_commit() const {
#if defined(__CUDA_ARCH__)
    cuda::cp_async_commit();
#endif
  }
  template <int N>
  KVATTN_HD void cp_async_wait() const {
#if defined(__CUDA_ARCH__)
    cuda::cp_async_wait<N>();
#endif
  }
  template <class T>
  KVATTN_HD T ldg(const T* p) const {
#if defined(__CUDA_ARCH__)
    return __ldg(p);
#else
    return *p;
#endif
  }
};
#endif  // __CUDACC__

}  // namespace kvattn::fa2
