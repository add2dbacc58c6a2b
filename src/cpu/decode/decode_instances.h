// The decode kernel's instances (decode_kernel.h), as the kernel table reaches them: per KV dtype,
// head dims and padded GQA group, the decode_task to run. Included by the files that instantiate
// them, one per (vector ISA, KV dtype) (decode_kernels_isa_kv.cc.in) and decode_scalar.cc.
#pragma once

#include <algorithm>

#include "cpu/decode/decode_kernel.h"

namespace kvattn::cpu::decode_detail {

template <class S, DType kKV, int kDqk, int kDvo>
DecodeItemFn pick_group_block(int group_padded) {
  switch (std::min(group_padded, 8)) {
    case 1:
      return &decode_task<S, kKV, kDqk, kDvo, 1>;
    case 2:
      return &decode_task<S, kKV, kDqk, kDvo, 2>;
    case 4:
      return &decode_task<S, kKV, kDqk, kDvo, 4>;
    case 8:
      return &decode_task<S, kKV, kDqk, kDvo, 8>;
    default:
      return nullptr;
  }
}

// Head dims 64, 128 and 256 (equal) get unrolled kernels on the vector ISAs; every other pair
// runs the generic kernel (runtime dims, masked tail).
template <class S, DType kKV>
DecodeItemFn pick_dims(int dqk, int dvo, int group_padded) {
  if constexpr (S::kWidth > 1) {
    if (dqk == dvo && dqk == 64) return pick_group_block<S, kKV, 64, 64>(group_padded);
    if (dqk == dvo && dqk == 128) return pick_group_block<S, kKV, 128, 128>(group_padded);
    if (dqk == dvo && dqk == 256) return pick_group_block<S, kKV, 256, 256>(group_padded);
  }
  return pick_group_block<S, kKV, 0, 0>(group_padded);
}

template <class S>
DecodeItemFn find_kernel(DType kv, int dqk, int dvo, int group_padded) {
  switch (kv) {
    case DType::kF32:
      return pick_dims<S, DType::kF32>(dqk, dvo, group_padded);
    case DType::kF16:
      return pick_dims<S, DType::kF16>(dqk, dvo, group_padded);
    case DType::kBF16:
      return pick_dims<S, DType::kBF16>(dqk, dvo, group_padded);
    case DType::kE4M3:
      return pick_dims<S, DType::kE4M3>(dqk, dvo, group_padded);
    case DType::kE5M2:
      return pick_dims<S, DType::kE5M2>(dqk, dvo, group_padded);
    default:
      return nullptr;
  }
}

}  // namespace kvattn::cpu::decode_detail
