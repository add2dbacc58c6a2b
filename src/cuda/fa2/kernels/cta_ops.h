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
#endif

namespace kvattn::fa2 {

#if defined(__CUDACC__)
// The device's operations. Its methods are host-device so that the host-device body compiles
// for both sides; only the device side is ever run (the host side traps).
struct DeviceOps {
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
  KVATTN_HD void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) const {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(row)));
#else
    r[0] = r[1] = r[2] = r[3] = row ? 0u : 0u;
#endif
  }
  KVATTN_HD void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) const {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(row)));
#else
    r[0] = r[1] = r[2] = r[3] = row ? 0u : 0u;
#endif
  }
  template <class F>
  KVATTN_HD void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) const {
#if defined(__CUDA_ARCH__)
    if constexpr (F::kF16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#else
    (void)d, (void)a, (void)b0, (void)b1;
#endif
  }
  KVATTN_HD void cp_async_16(void* smem, const void* gmem, bool valid) const {
#if defined(__CUDA_ARCH__)
    // The src-size operand: 0 bytes read and 16 zero-filled for a row past the keys.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
                 "l"(gmem), "r"(valid ? 16 : 0));
#else
    (void)smem, (void)gmem, (void)valid;
#endif
  }
  KVATTN_HD void cp_async_commit() const {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
  }
  template <int N>
  KVATTN_HD void cp_async_wait() const {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

 private:
  static KVATTN_HD uint32_t smem_address(const void* p) {
#if defined(__CUDA_ARCH__)
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#else
    return p ? 1u : 0u;
#endif
  }
};
#endif  // __CUDACC__

}  // namespace kvattn::fa2
