// The key of fa2's and fa3's kernel tables: what a kernel instantiation is compiled for (q dtype,
// kv dtype, head dims). Everything else (mask, window, soft cap, position encoding, layout, o
// dtype) is a run-time parameter of the same kernel. Each backend names it as its own
// (fa2/kernel_key.h, fa3/kernel_key.h).
#pragma once

#include <string>

#include "kvattn/dtype.h"
#include "kvattn/problem.h"

namespace kvattn::cuda {

struct KernelKey {
  DType q = DType::kF32;
  DType kv = DType::kF32;
  int head_dim_qk = 0;
  int head_dim_vo = 0;
  constexpr bool operator==(const KernelKey&) const = default;
};

inline KernelKey kernel_key(const Problem& p) {
  return KernelKey{p.q_dtype, p.kv_dtype, p.head_dim_qk, p.head_dim_vo};
}

// "q bf16, kv e4m3, head dims (128, 128)"
inline std::string kernel_key_string(const KernelKey& k) {
  return "q " + std::string(dtype_name(k.q)) + ", kv " + std::string(dtype_name(k.kv)) +
         ", head dims (" + std::to_string(k.head_dim_qk) + ", " + std::to_string(k.head_dim_vo) +
         ")";
}

}  // namespace kvattn::cuda
