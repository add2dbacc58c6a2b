// The device's operations for fa3's kernel body (prefill_cta.h): one SM90 thread's instructions,
// the inline PTX of sm90_ptx.cuh and sm90_wgmma_fp8.cuh and the SM80 wrappers of
// cuda/common/ptx.cuh. Every method is a forced-inline host/device function so that the one body
// compiles for both sides of nvcc; only the device side ever runs (the host side is empty). The
// CPU's counterpart binds the same names to the SM90 CTA emulator (tests/cuda/fa3/fa3_emu_ops.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/hd.h"
#include "cuda/common/fast_div.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/warp_shuffles.cuh"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/l2_hint.h"
#include "cuda/fa3/kernels/sm90_ptx.cuh"
#include "cuda/fa3/kernels/sm90_wgmma_fp8.cuh"

namespace kvattn::fa3 {

// The full-warp shuffles (shfl_xor, shfl, shfl_u32) are the shared cuda::WarpShuffles.
struct DeviceOps : cuda::WarpShuffles {
  template <int N>
  using Acc = float[N];
  using AFrag = uint32_t[4];
  using U4 = uint4;
  using U2 = uint2;

#if defined(__CUDA_ARCH__)
#define KVATTN_FA3_DEVICE(...) __VA_ARGS__
#else
#define KVATTN_FA3_DEVICE(...)
#endif

#if defined(__CUDA_ARCH__)
  static __device__ __forceinline__ uint64_t l2_policy(L2Hint hint) {
    return hint == L2Hint::kEvictLast ? ptx::l2_policy_evict_last() : ptx::l2_policy_evict_first();
  }
#endif

  // Unsigned, as threadIdx.x is (the body's divisions and remainders by it are unsigned).
  KVATTN_HD unsigned thread() const {
#if defined(__CUDA_ARCH__)
    return threadIdx.x;
#else
    return 0u;
#endif
  }
  KVATTN_HD int cta() const {
#if defined(__CUDA_ARCH__)
    return int(blockIdx.x);
#else
    return 0;
#endif
  }
  KVATTN_HD int ctas() const {
#if defined(__CUDA_ARCH__)
    return int(gridDim.x);
#else
    return 1;
#endif
  }
  KVATTN_HD uint32_t smem_addr(const void* p) const {
#if defined(__CUDA_ARCH__)
    return cuda::smem_addr(p);
#else
    return p ? 0u : 0u;
#endif
  }
  // 16 bytes of global memory (q rows), 8 (FP8 V pieces: v_transpose.h) at an L2 priority
  // (l2_hint.h), and one byte (rows not in 16-byte chunks). The hint is a constant at every
  // call: the branches fold.
  KVATTN_HD uint4 ld16(const void* p, L2Hint hint = L2Hint::kNormal) const {
    KVATTN_FA3_DEVICE(if (hint != L2Hint::kNormal) return ptx::ld16_hint(p, l2_policy(hint)));
    return *reinterpret_cast<const uint4*>(p);
  }
  KVATTN_HD uint2 ld8(const void* p, L2Hint hint = L2Hint::kNormal) const {
    KVATTN_FA3_DEVICE(if (hint != L2Hint::kNormal) return ptx::ld8_hint(p, l2_policy(hint)));
    return *reinterpret_cast<const uint2*>(p);
  }
  KVATTN_HD uint8_t ld_byte(const void* p) const { return *static_cast<const uint8_t*>(p); }
  template <class T>
  KVATTN_HD void st_shared(T* p, T v) const {
    *p = v;
  }
  // One store to global memory (the epilogue's: 16 bytes a row chunk, or an element of a strided
  // output).
  template <class T>
  KVATTN_HD void st_global(T* p, T v) const {
    *p = v;
  }

  // n / d's divisor: a multiply-high and a shift (the page size: kv_copies.h's kv_row).
  KVATTN_HD uint32_t fast_div(const cuda::FastDiv& d, uint32_t n) const { return d.div(n); }

  KVATTN_HD void mbarrier_init(uint64_t* bar, int count) const {
    KVATTN_FA3_DEVICE(ptx::mbarrier_init(bar, count));
  }
  KVATTN_HD void fence_barrier_init() const { KVATTN_FA3_DEVICE(ptx::fence_barrier_init()); }
  KVATTN_HD void mbarrier_arrive(uint64_t* bar) const {
    KVATTN_FA3_DEVICE(ptx::mbarrier_arrive(bar));
  }
  KVATTN_HD void mbarrier_wait(uint64_t* bar, uint32_t parity) const {
    KVATTN_FA3_DEVICE(ptx::mbarrier_wait(bar, parity));
  }
  KVATTN_HD void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) const {
    KVATTN_FA3_DEVICE(ptx::mbarrier_arrive_expect_tx(bar, bytes));
  }
  KVATTN_HD void tma_load_4d(void* smem_dst, const void* tensor_map, int c0, int c1, int c2,
                             int c3, uint64_t* bar, L2Hint hint = L2Hint::kNormal) const {
    KVATTN_FA3_DEVICE(if (hint != L2Hint::kNormal) {
      ptx::tma_load_4d_hint(smem_dst, tensor_map, c0, c1, c2, c3, bar, l2_policy(hint));
    } else { ptx::tma_load_4d(smem_dst, tensor_map, c0, c1, c2, c3, bar); });
  }
  KVATTN_HD void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid,
                                   L2Hint hint = L2Hint::kNormal) const {
    KVATTN_FA3_DEVICE(if (hint != L2Hint::kNormal) {
      ptx::cp_async_16_zfill_hint(smem_dst, gmem_src, valid, l2_policy(hint));
    } else { cuda::cp_async_16_zfill(smem_dst, gmem_src, valid); });
  }
  KVATTN_HD void cp_async_wait_all() const { KVATTN_FA3_DEVICE(cuda::cp_async_wait_all()); }
  KVATTN_HD void cp_async_mbarrier_arrive_noinc(uint64_t* bar) const {
    KVATTN_FA3_DEVICE(ptx::cp_async_mbarrier_arrive_noinc(bar));
  }
  KVATTN_HD void fence_proxy_async() const { KVATTN_FA3_DEVICE(ptx::fence_proxy_async()); }
  KVATTN_HD void named_barrier_sync(int id, int threads) const {
    KVATTN_FA3_DEVICE(ptx::named_barrier_sync(id, threads));
  }
  KVATTN_HD void named_barrier_arrive(int id, int threads) const {
    KVATTN_FA3_DEVICE(ptx::named_barrier_arrive(id, threads));
  }
  KVATTN_HD void sync_threads() const { KVATTN_FA3_DEVICE(__syncthreads()); }
  template <int N>
  KVATTN_HD void setmaxnreg_inc() const {
    KVATTN_FA3_DEVICE(ptx::setmaxnreg_inc<N>());
  }
  template <int N>
  KVATTN_HD void setmaxnreg_dec() const {
    KVATTN_FA3_DEVICE(ptx::setmaxnreg_dec<N>());
  }
  KVATTN_HD void syncwarp() const { KVATTN_FA3_DEVICE(__syncwarp()); }
  template <class T>
  KVATTN_HD T ld_shared(const T* p) const {
    return *p;
  }
  // bar.red.or.pred: named barrier `id` over `threads`, true when any of them passed true.
  KVATTN_HD bool named_barrier_red_or(int id, int threads, bool pred) const {
#if defined(__CUDA_ARCH__)
    uint32_t any;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\n"
        "selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(any)
        : "r"(uint32_t(pred)), "r"(id), "r"(threads)
        : "memory");
    return any != 0;
#else
    return pred && id >= 0 && threads > 0;
#endif
  }

  KVATTN_HD void wgmma_fence() const { KVATTN_FA3_DEVICE(ptx::wgmma_fence()); }
  KVATTN_HD void wgmma_commit() const { KVATTN_FA3_DEVICE(ptx::wgmma_commit()); }
  template <int Pending>
  KVATTN_HD void wgmma_wait() const {
    KVATTN_FA3_DEVICE(ptx::wgmma_wait<Pending>());
  }
  // S (+)= Q K^T for N keys, one k-step (sm90_ptx.cuh's wgmma_ss).
  template <class Tag, int N>
  KVATTN_HD void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc,
                          int accumulate) const {
    KVATTN_FA3_DEVICE(ptx::wgmma_ss<Tag, N>(d, a_desc, b_desc, accumulate));
  }
  // O (+)= P V for N dims of V, one k-step (sm90_ptx.cuh's wgmma_rs).
  template <class Tag, int N>
  KVATTN_HD void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc,
                          int accumulate) const {
    KVATTN_FA3_DEVICE(ptx::wgmma_rs<Tag, N>(d, a, b_desc, accumulate));
  }
  template <int N>
  KVATTN_HD void fence_registers(float (&d)[N]) const {
    KVATTN_FA3_DEVICE(ptx::fence_registers(d));
  }
  KVATTN_HD void fence_registers(uint32_t (&a)[4]) const {
    KVATTN_FA3_DEVICE(ptx::fence_registers(a));
  }
  template <class Tag>
  KVATTN_HD uint32_t pack16(float lo, float hi) const {
#if defined(__CUDA_ARCH__)
    return cuda::Compute16<Tag>::pack(lo, hi);
#else
    return uint32_t(lo + hi) * 0u;
#endif
  }
  KVATTN_HD uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) const {
#if defined(__CUDA_ARCH__)
    return ptx::pack_e4m3x4(x0, x1, x2, x3);
#else
    return uint32_t(x0 + x1 + x2 + x3) * 0u;
#endif
  }
#undef KVATTN_FA3_DEVICE
};

}  // namespace kvattn::fa3
