// fa3's element types, for the kernel body (prefill_cta.h) on the GPU and on the CPU alike: the
// type tags the kernel is instantiated with and what differs between the 16-bit and the FP8
// kernel (element size, and with it the k-step of wgmma (k16 / k32), the tile layout (64 / 128
// columns per panel) and how V is stored (as is, read MN-major / transposed with renumbered
// keys, read K-major: FP8 wgmma has no transpose)). Host C++ and CUDA alike: no CUDA header.
#pragma once

namespace kvattn::cuda {
// Defined in cuda/common/ptx.cuh (a device header); tags are only ever named, never made.
struct Bf16Tag;
struct F16Tag;
}  // namespace kvattn::cuda

namespace kvattn::fa3 {

// FP8 element tags (q = kv e4m3 or e5m2); the 16-bit ones are cuda::Bf16Tag and cuda::F16Tag.
struct E4m3Tag {};
struct E5m2Tag {};
// Mixed FP8 pairs: q e4m3 over an e5m2 cache, and q e5m2 over an e4m3 cache.
struct E4m3E5m2Tag {};
struct E5m2E4m3Tag {};

// The element type of one operand (what the emulator's wgmma reads).
enum class ElemKind { kBf16, kF16, kE4m3, kE5m2 };

// kQ: Q's and the score GEMM's A; kKv: K's and V's. P is kQ for 16-bit, e4m3 for every FP8 pair.
template <class Tag>
struct Elem {
  static constexpr int kBytes = 2;
  static constexpr bool kFp8 = false;
  static constexpr ElemKind kQ = ElemKind::kBf16, kKv = ElemKind::kBf16;
};
template <>
struct Elem<cuda::F16Tag> : Elem<cuda::Bf16Tag> {
  static constexpr ElemKind kQ = ElemKind::kF16, kKv = ElemKind::kF16;
};
template <>
struct Elem<E4m3Tag> {
  static constexpr int kBytes = 1;
  static constexpr bool kFp8 = true;
  static constexpr ElemKind kQ = ElemKind::kE4m3, kKv = ElemKind::kE4m3;
};
template <>
struct Elem<E5m2Tag> : Elem<E4m3Tag> {
  static constexpr ElemKind kQ = ElemKind::kE5m2, kKv = ElemKind::kE5m2;
};
template <>
struct Elem<E4m3E5m2Tag> : Elem<E4m3Tag> {
  static constexpr ElemKind kQ = ElemKind::kE4m3, kKv = ElemKind::kE5m2;
};
template <>
struct Elem<E5m2E4m3Tag> : Elem<E4m3Tag> {
  static constexpr ElemKind kQ = ElemKind::kE5m2, kKv = ElemKind::kE4m3;
};

}  // namespace kvattn::fa3
