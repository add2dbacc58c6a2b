// FP8 wgmma shapes beyond fa3's d128 ones (sm90_ptx.cuh): S = Q K^T over 64-key blocks
// (m64n64k32, head dim 256) and O = P V with N = 64 (m64n64k32, head dim 64; head dim 256 runs
// its P V as two m64n128k32 halves, consumer_steps.h's pv_promoted). As there: P is e4m3 for
// every cache (e4m3 against an e5m2 V), B is K-major (FP8 wgmma has no transpose; the producer
// stores V transposed), operands in the 128-byte swizzle. Written from the d128 forms; only the
// shape and the types differ.
#pragma once

#include <cstdint>

#include "cuda/fa3/kernels/sm90_ptx.cuh"

namespace kvattn::fa3::ptx {

template <>
__device__ __forceinline__ void wgmma_ss_m64n64<E4m3Tag>(float (&d)[32], uint64_t a_desc,
                                                         uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3\n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      "%32, %33, p, 1, 1;\n}\n"
      : KVATTN_WGMMA_D32(d)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_ss_m64n64<E5m2Tag>(float (&d)[32], uint64_t a_desc,
                                                         uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e5m2\n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      "%32, %33, p, 1, 1;\n}\n"
      : KVATTN_WGMMA_D32(d)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_ss_m64n64<E4m3E5m2Tag>(float (&d)[32], uint64_t a_desc,
                                                             uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2\n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      "%32, %33, p, 1, 1;\n}\n"
      : KVATTN_WGMMA_D32(d)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_ss_m64n64<E5m2E4m3Tag>(float (&d)[32], uint64_t a_desc,
                                                             uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e4m3\n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      "%32, %33, p, 1, 1;\n}\n"
      : KVATTN_WGMMA_D32(d)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_rs_m64n64<E4m3Tag>(float (&d)[32], const uint32_t (&a)[4],
                                                         uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3\n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : KVATTN_WGMMA_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_rs_m64n64<E5m2Tag>(float (&d)[32], const uint32_t (&a)[4],
                                                         uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2\n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : KVATTN_WGMMA_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_rs_m64n64<E4m3E5m2Tag>(float (&d)[32], const uint32_t (&a)[4],
                                                             uint64_t b_desc, int accumulate) {
  wgmma_rs_m64n64<E5m2Tag>(d, a, b_desc, accumulate);
}

template <>
__device__ __forceinline__ void wgmma_rs_m64n64<E5m2E4m3Tag>(float (&d)[32], const uint32_t (&a)[4],
                                                             uint64_t b_desc, int accumulate) {
  wgmma_rs_m64n64<E4m3Tag>(d, a, b_desc, accumulate);
}

#undef KVATTN_WGMMA_D32
#undef KVATTN_WGMMA_D128
#undef KVATTN_WGMMA_D64

}  // namespace kvattn::fa3::ptx
